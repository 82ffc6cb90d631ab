"""Drafter/target compatibility: Gemma transform inheritance, pairing checks, older drafter layouts."""
