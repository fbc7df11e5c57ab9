"""Core: errors, unit parsing, input checks, the vocabularies of choices."""
