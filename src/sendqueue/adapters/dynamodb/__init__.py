"""The TaskStore on DynamoDB (:mod:`~sendqueue.adapters.dynamodb.store`)."""
