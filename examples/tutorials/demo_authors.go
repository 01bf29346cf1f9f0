package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// authorRename names the demo's author, then renames them, and each time
// waits until the cards index shows the name on every tutorial of this
// run (and no card of a deleted one). Each is one write to the authors
// table: the service appends no event for it, and the relay reads the
// cards of all that author's tutorials again from the cards' definition.
func (d *demo) authorRename(ctx context.Context) error {
	path := "/api/authors/" + url.PathEscape(d.User)
	r, err := d.call(ctx, "GET", path+"/tutorials", "", nil)
	if err != nil {
		return err
	}
	if r.status == http.StatusServiceUnavailable {
		d.say("the cards index is not configured: no author rename")
		return nil
	}
	for i, name := range []string{"Ada " + d.run, "Ada Lovelace " + d.run} {
		r, err := d.call(ctx, "PUT", path, d.run+"-author-"+strconv.Itoa(i), map[string]string{"name": name})
		if err != nil {
			return err
		}
		if err := expect(r, http.StatusOK, "name the author"); err != nil {
			return err
		}
		start := time.Now()
		total, err := d.awaitCards(ctx, path+"/tutorials", name)
		if err != nil {
			return err
		}
		took := time.Since(start).Round(time.Millisecond)
		if i == 0 {
			d.say("named author %s %q: the cards index shows the name on this run's %d tutorials after %s", d.User, name, len(d.want), took)
			continue
		}
		d.say("author rename reached all %d of this run's tutorials in the cards index in %s (%d cards of %s in all): one UPDATE of authors, no event appended by the service; the watch refreshed every tutorial of the author",
			len(d.want), took, total, d.User)
	}
	return nil
}

// awaitCards polls the author's cards until every live tutorial of this
// run shows name and its title, and no deleted one is there; it returns
// how many cards the author has.
func (d *demo) awaitCards(ctx context.Context, path, name string) (int, error) {
	deadline := time.Now().Add(d.Wait)
	for {
		r, err := d.call(ctx, "GET", path, "", nil)
		if err != nil {
			return 0, err
		}
		if err := expect(r, http.StatusOK, "author's cards"); err != nil {
			return 0, err
		}
		var got AuthorCards
		if err := json.Unmarshal(r.body, &got); err != nil {
			return 0, fmt.Errorf("demo: author's cards: %w", err)
		}
		problem := d.checkCards(got, name)
		if problem == "" {
			return got.Total, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("demo: the cards index did not show author %q within %s: %s", name, d.Wait, problem)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// checkCards says what is still wrong with the author's cards, or "".
func (d *demo) checkCards(got AuthorCards, name string) string {
	cards := map[string]Card{}
	for _, c := range got.Cards {
		cards[c.ID] = c
	}
	for id, title := range d.want {
		c, ok := cards[id]
		switch {
		case !ok:
			return fmt.Sprintf("no card for tutorial %s", id)
		case c.Author != name:
			return fmt.Sprintf("tutorial %s's card shows author %q", id, c.Author)
		case c.Title != title:
			return fmt.Sprintf("tutorial %s's card has title %q, want %q", id, c.Title, title)
		}
	}
	for id := range d.gone {
		if _, ok := cards[id]; ok {
			return fmt.Sprintf("deleted tutorial %s still has a card", id)
		}
	}
	return ""
}
