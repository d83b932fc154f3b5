"""The pure domain: states, policy, planner, models and errors. No I/O."""
