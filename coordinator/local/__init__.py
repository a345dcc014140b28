"""This machine's side of a lock: the local lock records that let one user's processes
see each other's holds (``locallocks``), who owns a hold (``owners``) and the process
group a command runs in (``procgroup``)."""
