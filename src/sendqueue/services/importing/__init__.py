"""Recipients in: CSV and JSON rows checked, rendered and stored in two passes."""
