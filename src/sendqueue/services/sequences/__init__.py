"""Sequences: the later steps of a campaign, made when the step before them is sent."""
