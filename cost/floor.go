package cost

// payloadBytesPerVertex is the size-derived floor of a charge: a payload
// of b bytes is charged at least b / payloadBytesPerVertex vertices,
// whatever its vertex_count says. Real GeoJSON takes 13 to 40 bytes per
// vertex and WKB at least 16, so honest geometry is charged its count; a
// payload that is big for its count (a forged count, large properties,
// thousands of empty members) is charged for its size, because decoding
// it takes memory in proportion to its bytes, not to its vertices.
const payloadBytesPerVertex = 64

// sizeFloor is the least charge of a payload of n bytes.
func sizeFloor(n int) int64 { return int64(n / payloadBytesPerVertex) }

// payloadCharge is the vertex count stamped for, or computed from, a payload:
// 0 for an empty payload, otherwise CountPayload raised to at least 1 so that
// ParseCount accepts it for a non-empty payload, and, for GeoJSON, to the
// number of coordinate arrays the geometry holds: a MultiPolygon of a
// million empty polygons has no vertex, but decoding it builds a million
// polygons, and it is charged for them.
func payloadCharge(payload []byte) (int64, error) {
	if len(payload) == 0 {
		return 0, nil
	}
	f, body, err := sniff(payload)
	if err != nil {
		return 0, err
	}
	var n, parts int
	if f == formatGeoJSON {
		n, parts, err = countGeoJSONParts(body)
	} else {
		n, _, err = scanBinary(body)
	}
	if err != nil {
		return 0, err
	}
	return max(int64(n), int64(parts), 1), nil
}
