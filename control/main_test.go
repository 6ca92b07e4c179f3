package control_test

import (
	"testing"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
)

// redisAddr is a private redis-server for the examples, started by TestMain.
var redisAddr string

func TestMain(m *testing.M) { redistest.RunMain(m, &redisAddr) }
