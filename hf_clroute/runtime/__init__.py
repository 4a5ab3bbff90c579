"""Process-wide settings: progress output and thread counts."""
