"""What ``Coordinator`` (``api``) and the commands offer on top of the engines:
deployments (``admin``), member changes (``reconfig``), import and purge, the fleet
view, `cluster restored`, drift, the RBAC a command needs (``rbac``) and the exit
verdicts of the answers (``verdicts``)."""
