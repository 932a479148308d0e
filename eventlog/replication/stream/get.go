package stream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The stream allows direct gets (StreamConfig), and the client library then
// sends every message read to whichever replica answers first. A replica
// may be behind the leader, so a read that must see every acknowledged
// publish (a publisher's resume point, the ends and starts a follower or a
// consumer's gap check relies on) goes through the message-get API, which
// the stream leader answers. Only a reader that tolerates a stale answer
// (the cluster view while its consumer is away) uses direct gets.

// APISubject is the JetStream API subject for what (e.g.
// "STREAM.MSG.GET.<stream>") under js's API prefix or domain.
func APISubject(js jetstream.JetStream, what string) string {
	o := js.Options()
	prefix := o.APIPrefix
	if o.Domain != "" {
		prefix = "$JS." + o.Domain + ".API"
	}
	if prefix == "" {
		prefix = jetstream.DefaultAPIPrefix
	}
	return strings.TrimSuffix(prefix, ".") + "." + what
}

// GetRequest names one message: by sequence, the first at or after Seq on
// a subject (NextBySubject), or the last on a subject (LastBySubject).
type GetRequest struct {
	Seq           uint64 `json:"seq,omitempty"`
	LastBySubject string `json:"last_by_subj,omitempty"`
	NextBySubject string `json:"next_by_subj,omitempty"`
}

// LeaderGet reads one message of stream name from its leader. No such
// message is jetstream.ErrMsgNotFound.
func LeaderGet(ctx context.Context, js jetstream.JetStream, name string, req GetRequest) (*jetstream.RawStreamMsg, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		// As the client library bounds its own API requests.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, js.Options().DefaultTimeout)
		defer cancel()
	}
	m, err := js.Conn().RequestWithContext(ctx, APISubject(js, "STREAM.MSG.GET."+name), body)
	if err != nil {
		return nil, err
	}
	var resp struct {
		Error   *jetstream.APIError `json:"error"`
		Message *struct {
			Subject  string    `json:"subject"`
			Sequence uint64    `json:"seq"`
			Header   []byte    `json:"hdrs"`
			Data     []byte    `json:"data"`
			Time     time.Time `json:"time"`
		} `json:"message"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return nil, fmt.Errorf("stream %s: message get answer: %w", name, err)
	}
	if resp.Error != nil {
		if resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound {
			return nil, jetstream.ErrMsgNotFound
		}
		return nil, resp.Error
	}
	if resp.Message == nil {
		return nil, errors.New("stream " + name + ": message get answered no message")
	}
	out := &jetstream.RawStreamMsg{Subject: resp.Message.Subject, Sequence: resp.Message.Sequence, Data: resp.Message.Data, Time: resp.Message.Time}
	if len(resp.Message.Header) > 0 {
		if out.Header, err = nats.DecodeHeadersMsg(resp.Message.Header); err != nil {
			return nil, fmt.Errorf("stream %s: message %d headers: %w", name, out.Sequence, err)
		}
	}
	return out, nil
}
