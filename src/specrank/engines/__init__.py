"""What specrank reads from serving engines, without importing them: an engine's metric names and shapes, and
which of its releases serve which speculative settings."""
