"""kvbridge's built-in plugins, registered through the same manager as third-party ones."""
