"""Calendar module: calendars and events in SQL, ICS export and import through jobs."""
