package controller_test

import (
	"os"
	"testing"

	"github.com/inferencecache/operator/test/integration/suite"
)

// The controllers' tests run against the shared integration suite: a real
// kube-apiserver and etcd with the shipped controllers and webhooks
// (test/integration/suite).
func TestMain(m *testing.M) {
	os.Exit(suite.Run(m))
}
