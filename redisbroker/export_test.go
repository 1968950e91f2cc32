package redisbroker

// RefreshScript exposes the keep-alive's refresh script to the tests.
var RefreshScript = refreshScript
