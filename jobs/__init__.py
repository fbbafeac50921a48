"""spark-submit-able jobs (each runs as a script; this file only lets tools import them)."""
