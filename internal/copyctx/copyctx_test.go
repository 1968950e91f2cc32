package copyctx

import (
	"context"
	"testing"
)

type valueKey struct{}

func TestOf(t *testing.T) {
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), valueKey{}, "v"))
	cp := Of(ctx)
	cancel()
	if cp.Err() != nil {
		t.Error("a copy's context ends with the delivery's")
	}
	if cp.Value(valueKey{}) != "v" {
		t.Error("a copy's context lost the delivery's values")
	}
	if !Is(cp) || Is(ctx) || Is(context.Background()) {
		t.Errorf("Is(copy) = %v, Is(delivery) = %v, want true, false", Is(cp), Is(ctx))
	}
}
