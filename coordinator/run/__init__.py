"""`lock run`: hold the lock while a command runs, renew it, and stop the command when
the lock is lost (``lockrun``)."""
