// Package origin is how the nodes of a fleet tell which node created a
// sandbox, and ask it (issue 26). A claim id's first 4 of 16 hex digits are
// a tag of the creating node's id (NodeTag), and a checkpoint id's likewise
// (so a node asked to claim another's checkpoint knows whom to import it
// from, issue 24); a node whose cluster view has
// not folded a sandbox asks the nodes with its tag (Ask) instead of taking
// "not in my view" for "gone". The question is GET /v1/sandboxes/{id}/owner
// with the caller's credentials and ProbeHeader, which the asked node
// answers from its own state and view without asking further (no loops
// when two nodes share a tag). The package holds no state.
package origin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/sbxlog/sbxlog/fsm"
)

// NodeTag is the 4 hex digits that node's claim ids start with.
func NodeTag(node string) string {
	h := sha256.Sum256([]byte(node))
	return hex.EncodeToString(h[:2])
}

// IDTag is the tag of claim or checkpoint id ("" when id is neither).
func IDTag(id string) string {
	if !fsm.ValidClaimID(id) && !fsm.ValidCheckpointID(id) {
		return ""
	}
	return id[3:7]
}

// ProbeHeader marks a node's question to the origin of an id.
const ProbeHeader = "X-Sbxlog-Origin-Probe"

// Wait bounds one question: a node that does not answer within it could
// not be asked.
const Wait = time.Second

// ErrNoAnswer: the origin's answer said neither "held" nor "not held"
// (it was down, refused the credentials, or is itself unsure: a 503).
var ErrNoAnswer = errors.New("origin: no answer on the sandbox")

// client asks origins; the bound is per question (ctx).
var client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4, IdleConnTimeout: 30 * time.Second}}

// Ask asks the node at addr (host:port) for the owner of sandbox id, with
// the caller's Authorization header: the owner's address when a node holds
// it live, "" when the asked node says none does (its 404), an error when
// it could not tell.
func Ask(ctx context.Context, addr, id, authorization string) (string, error) {
	if addr == "" {
		return "", ErrNoAnswer
	}
	ctx, cancel := context.WithTimeout(ctx, Wait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/v1/sandboxes/"+url.PathEscape(id)+"/owner", nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", authorization)
	req.Header.Set(ProbeHeader, "1")
	resp, err := client.Do(req)
	if err != nil {
		return "", errors.Join(ErrNoAnswer, err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		var body struct {
			OwnerAddr string `json:"owner_addr"`
		}
		if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&body); err != nil || body.OwnerAddr == "" {
			return "", ErrNoAnswer
		}
		return body.OwnerAddr, nil
	case http.StatusNotFound:
		return "", nil
	}
	return "", ErrNoAnswer
}
