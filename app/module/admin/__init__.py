"""Administration: periodic maintenance jobs and the schedules API."""
