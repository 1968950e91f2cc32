package telemetry

// Internals for the external tests.
var (
	ScopeVersion  = scopeVersion
	ModuleVersion = moduleVersion
)
