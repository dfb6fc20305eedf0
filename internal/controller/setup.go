package controller

import (
	"context"
	"fmt"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/apply"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/receipt"
	"github.com/inferencecache/operator/internal/validation"
	"github.com/inferencecache/operator/internal/webhook/podmutation"
)

// The manager's API client rate limits (--kube-api-qps, --kube-api-burst),
// Flux's defaults: controller-runtime's 20/30 made 1,000 CacheBackends
// created at once wait about eight minutes on the client side alone. An
// idle operator sends nothing whatever they are.
const (
	DefaultKubeAPIQPS   = 50
	DefaultKubeAPIBurst = 300
)

// DefaultMemoryLimitRatio is the fraction of the container's memory limit
// (GOMEMLIMIT as the install bundle sets it) the manager gives the Go
// runtime as its soft memory limit (--memory-limit-ratio), leaving room
// for memory the runtime does not count.
const DefaultMemoryLimitRatio = 0.9

// Options configure what Setup registers.
type Options struct {
	// Inject shapes the Pod webhook's injection.
	Inject inject.Options
	// Webhooks registers the Pod and CacheBackend webhooks on the manager's
	// webhook server.
	Webhooks bool
	// Namespace is the operator's own namespace, which holds the receipt
	// key Secret.
	Namespace string
	// Probe, when set, checks that cache servers answer before they are
	// Ready (the manager's --functional-probe).
	Probe *Prober
	// KeyRefresh is how often the receipt key Secret is re-read (30 s when zero).
	KeyRefresh time.Duration
	// ReceiptEventHorizon: pods older than this get no receipt event from a
	// manager that did not report them before (DefaultReceiptEventHorizon
	// when zero; keep it at most the API server's --event-ttl).
	ReceiptEventHorizon time.Duration
	// Index reads the KV-block index for status.indexParticipation (the
	// manager's --kvindex-status-url); IndexPoll is how often observed
	// backends are re-read (indexclient.DefaultPoll when zero).
	Index     IndexReader
	IndexPoll time.Duration
}

// Setup registers every reconciler (and, with opts.Webhooks, the webhooks)
// of the operator with mgr. The manager binary and the tests call it alike,
// so tests run the operator exactly as shipped.
func Setup(mgr ctrl.Manager, opts Options) error {
	rec := mgr.GetEventRecorder(v1alpha1.ReportingController)
	if opts.Namespace == "" {
		opts.Namespace = "inferencecache-system"
	}
	keys := &receipt.KeyRing{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Namespace: opts.Namespace, Name: receipt.DefaultSecretName, Refresh: opts.KeyRefresh}
	if err := mgr.Add(keys); err != nil {
		return err
	}
	servers, err := NewServerCache(mgr)
	if err != nil {
		return err
	}
	if err := mgr.Add(servers); err != nil {
		return err
	}
	r := &CacheBackendReconciler{
		Client:       mgr.GetClient(),
		Applier:      apply.New(mgr.GetClient()),
		Recorder:     rec,
		APIReader:    mgr.GetAPIReader(),
		Servers:      servers,
		ServerEvents: WatchServerPods(servers),
		Keys:         keys,
		Inject:       opts.Inject,
		Prober:       opts.Probe,
		Index:        opts.Index,
		IndexPoll:    opts.IndexPoll,
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the CacheBackend controller: %w", err)
	}
	pods, err := NewReceiptPodCache(mgr)
	if err != nil {
		return err
	}
	if err := mgr.Add(pods); err != nil {
		return err
	}
	rr := &ReceiptReconciler{Client: mgr.GetClient(), Keys: keys, Horizon: opts.ReceiptEventHorizon}
	if err := rr.SetupWithManager(mgr, pods); err != nil {
		return fmt.Errorf("setting up the receipt controller: %w", err)
	}
	if opts.Webhooks {
		srv := mgr.GetWebhookServer()
		idx, err := podmutation.IndexBackends(context.Background(), mgr.GetCache())
		if err != nil {
			return err
		}
		srv.Register(podmutation.MutatePath, podmutation.Served(&podmutation.Handler{Backends: idx, Reader: mgr.GetClient(), Options: opts.Inject, Keys: keys}, opts.Inject.Limits))
		srv.Register(validation.Path, validation.Guard(&webhook.Admission{Handler: &validation.Handler{Decoder: admission.NewDecoder(mgr.GetScheme()),
			Secrets: validation.SubjectAccessReviews{Client: mgr.GetClient()}}}, 0, 0))
	}
	return nil
}
