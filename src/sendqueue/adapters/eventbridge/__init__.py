"""The execution layer on AWS EventBridge Scheduler
(:mod:`~sendqueue.adapters.eventbridge.scheduler`)."""
