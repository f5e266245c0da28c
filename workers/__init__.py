"""Worker processes: step worker, compensator and sweeper."""
