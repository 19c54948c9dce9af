"""Calendar job workers, imported by init_jobs; stays empty so importing a request never pulls a worker."""
