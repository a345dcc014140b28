"""coordinator: majority-wins locks and quorum-replicated state across Kubernetes clusters."""

__version__ = "0.1.0"
