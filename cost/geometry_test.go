package cost_test

import (
	"testing"

	"github.com/twpayne/go-geom"

	"github.com/spillway-go/spillway/cost"
)

func TestVertices(t *testing.T) {
	square := [][]geom.Coord{{{0, 0}, {4, 0}, {4, 4}, {0, 4}, {0, 0}}}                                   // 5
	squareWithHole := append(square, []geom.Coord{{1, 1}, {2, 1}, {2, 2}, {1, 1}})                       // 5 + 4
	pointXY := geom.NewPoint(geom.XY).MustSetCoords(geom.Coord{1, 2})                                    // 1
	lineXYZ := geom.NewLineString(geom.XYZ).MustSetCoords([]geom.Coord{{0, 0, 0}, {1, 1, 1}, {2, 2, 2}}) // 3
	poly := geom.NewPolygon(geom.XY).MustSetCoords(squareWithHole)                                       // 9
	multiPoint := geom.NewMultiPoint(geom.XYM).MustSetCoords([]geom.Coord{{0, 0, 9}, {1, 1, 9}})         // 2

	nested := geom.NewGeometryCollection().MustPush(pointXY)
	for range 100 {
		nested = geom.NewGeometryCollection().MustPush(nested)
	}

	emptyPointInMulti := geom.NewMultiPoint(geom.XY)
	if err := emptyPointInMulti.Push(geom.NewPointEmpty(geom.XY)); err != nil {
		t.Fatal(err)
	}
	if err := emptyPointInMulti.Push(geom.NewPoint(geom.XY).MustSetCoords(geom.Coord{3, 4})); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name string
		g    geom.T
		want int
	}{
		{"nil", nil, 0},
		{"typed nil point", (*geom.Point)(nil), 0},
		{"typed nil polygon", (*geom.Polygon)(nil), 0},
		{"typed nil collection", (*geom.GeometryCollection)(nil), 0},

		{"point XY", pointXY, 1},
		{"point XYZM", geom.NewPoint(geom.XYZM).MustSetCoords(geom.Coord{1, 2, 3, 4}), 1},
		{"point empty", geom.NewPointEmpty(geom.XY), 0},
		{"point no layout", geom.NewPointEmpty(geom.NoLayout), 0},

		{"multipoint", multiPoint, 2},
		{"multipoint empty", geom.NewMultiPoint(geom.XY), 0},
		{"multipoint with an empty point", emptyPointInMulti, 1},

		{"linestring XYZ", lineXYZ, 3},
		{"linestring empty", geom.NewLineString(geom.XY), 0},
		{"linestring no layout", geom.NewLineString(geom.NoLayout), 0},

		{"multilinestring", geom.NewMultiLineString(geom.XY).MustSetCoords([][]geom.Coord{
			{{0, 0}, {1, 1}},
			{{2, 2}, {3, 3}, {4, 4}},
		}), 5},
		{"multilinestring empty", geom.NewMultiLineString(geom.XY), 0},

		{"linearring", geom.NewLinearRing(geom.XY).MustSetCoords(square[0]), 5},
		{"linearring empty", geom.NewLinearRing(geom.XY), 0},

		{"polygon shell only", geom.NewPolygon(geom.XY).MustSetCoords(square), 5},
		{"polygon with hole counts all rings", poly, 9},
		{"polygon empty", geom.NewPolygon(geom.XY), 0},

		{"multipolygon", geom.NewMultiPolygon(geom.XY).MustSetCoords([][][]geom.Coord{square, squareWithHole}), 14},
		{"multipolygon empty", geom.NewMultiPolygon(geom.XY), 0},

		{"collection empty", geom.NewGeometryCollection(), 0},
		{"collection mixed", geom.NewGeometryCollection().MustPush(pointXY, lineXYZ, poly, multiPoint), 1 + 3 + 9 + 2},
		{"collection nested", geom.NewGeometryCollection().MustPush(
			pointXY,
			geom.NewGeometryCollection().MustPush(poly, geom.NewGeometryCollection()),
			geom.NewGeometryCollection().MustPush(geom.NewGeometryCollection().MustPush(lineXYZ)),
		), 1 + 9 + 3},
		{"collection nested 101 deep", nested, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := cost.Vertices(tt.g); got != tt.want {
				t.Errorf("Vertices = %d, want %d", got, tt.want)
			}
		})
	}
}
