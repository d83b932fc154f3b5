"""The read side: the queries and views the CLI, the API and the pages share."""
