"""The update: group-relative advantages, the clipped loss, and the adapters' optimizer steps."""
