package sizing_test

// Test data shared with package cost's tests: one GeoJSON Feature per line.
const (
	countriesFile = "../testdata/countries-land-10km.ndjson"
	countiesFile  = "../testdata/us-counties-10m.ndjson"
)
