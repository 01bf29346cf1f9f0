package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// DemoOptions configures RunDemo.
type DemoOptions struct {
	BaseURL string // the example API, e.g. http://127.0.0.1:8080
	Out     io.Writer
	User    string        // X-User-ID; default "demo-user"
	Count   int           // tutorials to create; default 20
	Burst   int           // concurrent duplicate submits of one key; default 20
	Wait    time.Duration // how long search may take to converge; default 2m
	Client  *http.Client
}

// demo is one scripted run against the API.
type demo struct {
	DemoOptions
	run     string // a token unique to this run, in every body, to search by
	created []Tutorial
	want    map[string]string // id -> expected title in the index
	gone    map[string]bool   // ids that must not be searchable
}

// RunDemo plays a client with bad habits against the example API: it
// retries creates with the same key, fires a burst of concurrent duplicate
// submits, edits and deletes (retrying some), reuses a key for another
// payload, then polls search until the index shows exactly the expected
// tutorials, edited titles and no deleted ones. Then it names and renames
// its author and waits for the cards index (outboxd's documents from
// several tables) to show the new name on each of those tutorials. It
// returns an error when an answer is wrong or an index does not converge
// in time.
func RunDemo(ctx context.Context, opts DemoOptions) error {
	if opts.BaseURL == "" {
		return fmt.Errorf("demo: base URL: must not be empty")
	}
	opts.BaseURL = strings.TrimRight(opts.BaseURL, "/")
	if opts.Out == nil {
		opts.Out = io.Discard
	}
	if opts.User == "" {
		opts.User = "demo-user"
	}
	if opts.Count <= 0 {
		opts.Count = 20
	}
	if opts.Burst <= 0 {
		opts.Burst = 20
	}
	if opts.Wait <= 0 {
		opts.Wait = 2 * time.Minute
	}
	if opts.Client == nil {
		opts.Client = &http.Client{Timeout: 30 * time.Second}
	}
	d := &demo{DemoOptions: opts, run: "demo" + randomHex(4), want: map[string]string{}, gone: map[string]bool{}}
	d.say("demo run %q against %s as user %q", d.run, d.BaseURL, d.User)
	for _, step := range []func(context.Context) error{d.creates, d.burst, d.conflict, d.invalid, d.edits, d.deletes, d.converge, d.authorRename} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	return d.metrics(ctx)
}

func (d *demo) say(format string, args ...any) { fmt.Fprintf(d.Out, format+"\n", args...) }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

type demoResponse struct {
	status   int
	replayed bool
	body     []byte
}

func (d *demo) call(ctx context.Context, method, path, key string, body any) (demoResponse, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return demoResponse{}, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, d.BaseURL+path, rd)
	if err != nil {
		return demoResponse{}, err
	}
	req.Header.Set(HeaderUserID, d.User)
	if key != "" {
		req.Header.Set(HeaderIdempotencyKey, key)
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := d.Client.Do(req)
	if err != nil {
		return demoResponse{}, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return demoResponse{}, fmt.Errorf("%s %s: %w", method, path, err)
	}
	return demoResponse{status: res.StatusCode, replayed: res.Header.Get(HeaderReplayed) == "true", body: b}, nil
}

func expect(r demoResponse, status int, what string) error {
	if r.status != status {
		return fmt.Errorf("demo: %s: want HTTP %d, got %d: %s", what, status, r.status, bytes.TrimSpace(r.body))
	}
	return nil
}

func (d *demo) tutorial(i int) map[string]any {
	return map[string]any{
		"title": fmt.Sprintf("Tutorial %02d: idempotent writes", i),
		"body":  fmt.Sprintf("Part %d of the outbox walkthrough, %s.", i, d.run),
		"tags":  []string{"outbox", "demo"},
	}
}

// creates makes Count tutorials; every third one is "retried" twice with
// the same key, as a client does after a timeout.
func (d *demo) creates(ctx context.Context) error {
	retries, replays := 0, 0
	for i := 1; i <= d.Count; i++ {
		key := d.run + "-create-" + fmt.Sprint(i)
		attempts := 1
		if i%3 == 0 {
			attempts = 3
		}
		var first Tutorial
		for a := range attempts {
			r, err := d.call(ctx, "POST", "/api/tutorials", key, d.tutorial(i))
			if err != nil {
				return err
			}
			if err := expect(r, http.StatusCreated, "create"); err != nil {
				return err
			}
			var t Tutorial
			if err := json.Unmarshal(r.body, &t); err != nil {
				return fmt.Errorf("demo: create: %w", err)
			}
			if a == 0 {
				first = t
				continue
			}
			retries++
			if !r.replayed || t.ID != first.ID {
				return fmt.Errorf("demo: retry of create %d: want a replay of %s, got %s (replayed=%v)", i, first.ID, t.ID, r.replayed)
			}
			replays++
		}
		d.created = append(d.created, first)
		d.want[first.ID] = first.Title
	}
	d.say("created %d tutorials; %d retries with the same key were replayed (%d of %d), no duplicates", d.Count, retries, replays, retries)
	return nil
}

// burst submits one key from Burst goroutines at once, like a double
// click multiplied, then retries every 409 until it gets the first answer.
func (d *demo) burst(ctx context.Context) error {
	key := d.run + "-burst"
	body := map[string]any{"title": "Burst: submitted many times, stored once", "body": "Concurrent duplicates, " + d.run + ".", "tags": []string{"burst"}}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		codes = map[string]int{}
		ids   = map[string]bool{}
		errs  []error
	)
	start := make(chan struct{})
	for range d.Burst {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for attempt := 0; ; attempt++ {
				r, err := d.call(ctx, "POST", "/api/tutorials", key, body)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				label := fmt.Sprint(r.status)
				if r.replayed {
					label += " replayed"
				}
				if attempt == 0 {
					codes[label]++
				}
				var t Tutorial
				if r.status == http.StatusCreated && json.Unmarshal(r.body, &t) == nil {
					ids[t.ID] = true
				}
				mu.Unlock()
				if r.status != http.StatusConflict || attempt > 50 {
					if r.status != http.StatusCreated {
						mu.Lock()
						errs = append(errs, fmt.Errorf("burst: HTTP %d: %s", r.status, bytes.TrimSpace(r.body)))
						mu.Unlock()
					}
					return
				}
				// "still being processed": wait and retry with the same key.
				select {
				case <-ctx.Done():
					return
				case <-time.After(100 * time.Millisecond):
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		return fmt.Errorf("demo: %w", errs[0])
	}
	if len(ids) != 1 {
		return fmt.Errorf("demo: burst: want one tutorial id, got %d", len(ids))
	}
	for id := range ids {
		d.want[id] = body["title"].(string)
	}
	d.say("burst: %d concurrent submits of one key, first answers %v; every client ended with the same single tutorial", d.Burst, codes)
	return nil
}

// conflict reuses a create's key for different content.
func (d *demo) conflict(ctx context.Context) error {
	other := d.tutorial(1)
	other["title"] = "A different payload under an old key"
	r, err := d.call(ctx, "POST", "/api/tutorials", d.run+"-create-1", other)
	if err != nil {
		return err
	}
	if err := expect(r, http.StatusConflict, "same key, different payload"); err != nil {
		return err
	}
	d.say("same key, different payload: 409 %s", bytes.TrimSpace(r.body))
	return nil
}

// invalid shows validation answers; they do not consume keys.
func (d *demo) invalid(ctx context.Context) error {
	r, err := d.call(ctx, "POST", "/api/tutorials", d.run+"-invalid", map[string]any{"body": "no title"})
	if err != nil {
		return err
	}
	if err := expect(r, http.StatusBadRequest, "missing title"); err != nil {
		return err
	}
	d.say("missing title: 400 %s", bytes.TrimSpace(r.body))
	return nil
}

// edits retitles five tutorials; the first edit is retried.
func (d *demo) edits(ctx context.Context) error {
	n := min(5, len(d.created))
	for i := range n {
		t := d.created[i]
		body := map[string]any{"title": t.Title + " (edited)", "body": t.Body + " Revised.", "tags": []string{"outbox", "demo", "edited"}}
		key := d.run + "-edit-" + t.ID
		attempts := 1
		if i == 0 {
			attempts = 2
		}
		for a := range attempts {
			r, err := d.call(ctx, "PUT", "/api/tutorials/"+t.ID, key, body)
			if err != nil {
				return err
			}
			if err := expect(r, http.StatusOK, "edit"); err != nil {
				return err
			}
			if a > 0 && !r.replayed {
				return fmt.Errorf("demo: retried edit was not replayed")
			}
		}
		d.want[t.ID] = body["title"].(string)
	}
	d.say("edited %d tutorials (one edit retried and replayed; each edit bumped the row's version)", n)
	return nil
}

// deletes removes three tutorials (not edited ones); the first is retried.
func (d *demo) deletes(ctx context.Context) error {
	var n int
	for i := len(d.created) - 1; i >= 5 && n < 3; i-- {
		t := d.created[i]
		key := d.run + "-delete-" + t.ID
		attempts := 1
		if n == 0 {
			attempts = 2
		}
		for a := range attempts {
			r, err := d.call(ctx, "DELETE", "/api/tutorials/"+t.ID, key, nil)
			if err != nil {
				return err
			}
			if err := expect(r, http.StatusOK, "delete"); err != nil {
				return err
			}
			if a > 0 && !r.replayed {
				return fmt.Errorf("demo: retried delete was not replayed")
			}
		}
		delete(d.want, t.ID)
		d.gone[t.ID] = true
		n++
	}
	d.say("deleted %d tutorials (one delete retried and replayed)", n)
	return nil
}
