"""People in the loop: the approval policy, approval requests and decisions,
sagas that need attention, and notifications."""
