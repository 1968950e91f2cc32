package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// byteSize is a flag value in bytes that accepts plain numbers and unit
// suffixes: B, kB/MB/GB/TB (powers of 1000), KiB/MiB/GiB/TiB and the
// Kubernetes spellings Ki/Mi/Gi/Ti (powers of 1024), and K/M/G/T (powers of
// 1000, as Kubernetes reads them). Case is ignored except that "b" alone is
// bytes. Fractions are allowed: 1.5GiB.
type byteSize int64

var byteUnits = map[string]float64{
	"": 1, "b": 1,
	"k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
	"ki": 1 << 10, "kib": 1 << 10, "mi": 1 << 20, "mib": 1 << 20,
	"gi": 1 << 30, "gib": 1 << 30, "ti": 1 << 40, "tib": 1 << 40,
}

func parseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := len(t)
	for i > 0 && (t[i-1] < '0' || t[i-1] > '9') && t[i-1] != '.' {
		i--
	}
	num, unit := strings.TrimSpace(t[:i]), strings.ToLower(strings.TrimSpace(t[i:]))
	mult, ok := byteUnits[unit]
	if !ok {
		return 0, fmt.Errorf("%q: unknown unit %q (use B, KiB, MiB, GiB, TiB, kB, MB, GB, TB or Ki, Mi, Gi, Ti)", s, t[i:])
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("%q is not a size", s)
	}
	v := f * mult
	if v >= math.MaxInt64 || v <= math.MinInt64 {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return int64(math.Round(v)), nil
}

func (b *byteSize) String() string {
	if *b == 0 {
		return "0" // pflag leaves a zero default out of the help
	}
	return formatBytes(int64(*b))
}

// Set implements pflag.Value.
func (b *byteSize) Set(s string) error {
	v, err := parseBytes(s)
	if err != nil {
		return err
	}
	*b = byteSize(v)
	return nil
}

// Type implements pflag.Value.
func (b *byteSize) Type() string { return "bytes" }

// formatBytes prints n with a binary unit: "2 GiB", "1.5 MiB", "512 B".
func formatBytes(n int64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	f := float64(n)
	u := 0
	for math.Abs(f) >= 1024 && u < len(units)-1 {
		f /= 1024
		u++
	}
	if u == 0 {
		return strconv.FormatInt(n, 10) + " B"
	}
	s := strconv.FormatFloat(f, 'f', 1, 64)
	s = strings.TrimSuffix(s, ".0")
	return s + " " + units[u]
}

// group prints n with thousands separators: 1,234,567.
func group(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// short prints n compactly for chart labels: 950, 12.3k, 4.5M, 1.2G.
func short(n float64) string {
	switch a := math.Abs(n); {
	case a >= 1e9:
		return trimZero(strconv.FormatFloat(n/1e9, 'f', 1, 64)) + "G"
	case a >= 1e6:
		return trimZero(strconv.FormatFloat(n/1e6, 'f', 1, 64)) + "M"
	case a >= 1e3:
		return trimZero(strconv.FormatFloat(n/1e3, 'f', 1, 64)) + "k"
	}
	return strconv.FormatFloat(n, 'f', 0, 64)
}

func trimZero(s string) string { return strings.TrimSuffix(s, ".0") }
