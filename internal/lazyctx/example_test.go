package lazyctx_test

import (
	"context"
	"fmt"

	"github.com/spillway-go/spillway/internal/lazyctx"
)

func ExampleLife() {
	sub, cancel := context.WithCancel(context.Background())
	defer cancel()
	var life lazyctx.Life
	fmt.Println(life.Err(sub, nil)) // nothing built yet
	done := life.Context(sub, nil).Done()
	life.End()
	<-done
	fmt.Println(life.Err(sub, nil))
	// Output:
	// <nil>
	// context canceled
}
