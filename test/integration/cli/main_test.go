package cli_test

import (
	"os"
	"testing"

	"github.com/inferencecache/operator/test/integration/suite"
)

func TestMain(m *testing.M) {
	os.Exit(suite.Run(m))
}
