"""Sending one email: the worker a schedule invokes, and the message it builds."""
