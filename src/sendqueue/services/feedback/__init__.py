"""What comes back: bounces, complaints, replies, unsubscribes, and the suppression list."""
