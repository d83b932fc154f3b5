"""The execution layer's side: schedules written, tasks provisioned, drift reconciled."""
