"""One module per role, each with one ``@deploy`` entry point taking frozen settings."""
