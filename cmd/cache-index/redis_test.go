package main

import (
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

func TestRedisOptions(t *testing.T) {
	for _, tc := range []struct {
		name, addrs, sentinel string
		cluster               bool
		db                    int
		want                  string // the client's type, or the error's start
	}{
		{name: "one server", addrs: "redis:6379", want: "*redis.Client"},
		{name: "one server, database 2", addrs: "redis:6379", db: 2, want: "*redis.Client"},
		{name: "several nodes are a cluster", addrs: "r-0:6379, r-1:6379,r-2:6379", want: "*redis.ClusterClient"},
		{name: "a cluster's configuration endpoint", addrs: "clustercfg.example:6379", cluster: true, want: "*redis.ClusterClient"},
		{name: "sentinels", addrs: "s-0:26379,s-1:26379", sentinel: "mymaster", want: "*redis.Client"},
		{name: "a cluster has database 0 only", addrs: "r-0:6379,r-1:6379", db: 1, want: "--redis-db 1 with a cluster"},
		{name: "sentinel and cluster", addrs: "s-0:26379", sentinel: "m", cluster: true, want: "--redis-sentinel-master and --redis-cluster"},
		{name: "no port", addrs: "redis", want: `--redis-address "redis"`},
		{name: "empty", addrs: " , ", want: `--redis-address " , "`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opt, err := redisOptions(tc.addrs, tc.cluster, tc.sentinel, tc.db)
			if err != nil {
				if !strings.HasPrefix(err.Error(), tc.want) {
					t.Fatalf("error %q, want it to start %q", err, tc.want)
				}
				return
			}
			c := redisClient(opt)
			defer c.Close()
			if got := typeName(c); got != tc.want {
				t.Fatalf("client %s, want %s", got, tc.want)
			}
			// A cluster's slots are read again once a second old
			// (TestShardFailoverMidStream waited 45 s without).
			if cc, ok := c.(*redis.ClusterClient); ok && cc.Options().ClusterStateReloadInterval != clusterStateReload {
				t.Fatalf("cluster slots reloaded every %s, want %s", cc.Options().ClusterStateReloadInterval, clusterStateReload)
			}
		})
	}
}

func typeName(c redis.UniversalClient) string {
	switch c.(type) {
	case *redis.ClusterClient:
		return "*redis.ClusterClient"
	case *redis.Client:
		return "*redis.Client"
	}
	return "other"
}

// Flags that contradict each other are refused before anything starts.
func TestRedisFlagsRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--redis-placements=false", "--redis-read-model=false"}, "--redis-placements=false with --redis-read-model=false"},
		{[]string{"--redis-read-model-max-lag=-1s"}, "--redis-read-model-max-lag=-1s: want 0 or more"},
		{[]string{"--redis-wait-replicas=-1"}, "--redis-wait-replicas=-1: want 0 or more"},
	} {
		err := run(append([]string{"--store=redis"}, tc.args...))
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
}
