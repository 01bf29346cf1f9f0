package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/elastic/go-elasticsearch/v8"

	"github.com/outboxd/outboxd/indexer"
)

// connectElasticsearch builds the client and refuses, before any event is
// taken, a server or an index spec that cannot work; a server that does
// not answer yet is not refused (the relay reports the outage and waits).
func connectElasticsearch(ctx context.Context, es *esFlags, f relayFlags) (indexer.ClientConfig, *elasticsearch.Client, []byte, error) {
	esCfg, err := es.config()
	if err != nil {
		return esCfg, nil, nil, err
	}
	client, err := indexer.NewClient(esCfg)
	if err != nil {
		return esCfg, nil, nil, err
	}
	checkCtx, cancelCheck := context.WithTimeout(ctx, 15*time.Second)
	err = indexer.CheckServer(checkCtx, client)
	cancelCheck()
	if err != nil {
		return esCfg, nil, nil, fmt.Errorf("elasticsearch: %w", err)
	}
	var spec []byte
	if f.indexSpec != "" {
		if spec, err = os.ReadFile(f.indexSpec); err != nil {
			return esCfg, nil, nil, fmt.Errorf("index-spec: %w", err)
		}
		if err := checkIndexSpec(ctx, client, spec, len(esCfg.Addresses)); err != nil {
			return esCfg, nil, nil, fmt.Errorf("index-spec %s: %w", f.indexSpec, err)
		}
	}
	return esCfg, client, spec, nil
}

// checkIndexSpec asks up to one node per address: a request that cannot
// reach its node sets that node aside, so the next goes to another, and one
// dead node of a cluster does not stop the relay from starting.
func checkIndexSpec(ctx context.Context, client *elasticsearch.Client, spec []byte, nodes int) error {
	for i := 1; ; i++ {
		err := indexer.CheckIndexSpec(ctx, client, spec)
		var re *indexer.ResponseError
		if err == nil || errors.As(err, &re) || i >= nodes || ctx.Err() != nil {
			return err
		}
	}
}
