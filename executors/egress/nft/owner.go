package nft

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"

	"github.com/google/nftables"
)

// Owner is the sandboxd instance whose tables a call makes, reads and
// removes. Its tag, a short hash of the instance id, is in the name of every
// table it makes: sbx_egress_<tag>_<tap> for a lock, sbx_egress_<tag>_guard
// for the bridge guard, sbx_egress_<tag>_doors for the refusal of local
// connections to the doors. Two instances on one host (a second sandboxd, another
// data dir) each see only their own tables, so neither ever repairs, replaces
// or removes the other's locks. The zero Owner owns nothing: every call on it
// is ErrNoOwner.
type Owner struct{ tag string }

// ErrNoOwner: a call on the zero Owner (no instance id).
var ErrNoOwner = errors.New("nft: no owning instance")

// tagLen is the hex digits of the tag: 32 bits, so two instances on one host
// share a tag with odds of 2^-32, and a table name stays short enough to read
// in `nft list tables`.
const tagLen = 8

// OwnerOf is the Owner of instance id; an empty id gives the zero Owner.
func OwnerOf(instance string) Owner {
	if instance == "" {
		return Owner{}
	}
	sum := sha256.Sum256([]byte("sbx-egress-nft/" + instance))
	return Owner{tag: hex.EncodeToString(sum[:])[:tagLen]}
}

// Tag is the owner's part of its table names.
func (o Owner) Tag() string { return o.tag }

func (o Owner) check() error {
	if o.tag == "" {
		return ErrNoOwner
	}
	return nil
}

// prefix starts the name of every table o makes. A tap name never holds
// "_" (executors/tap.Name is base32), so the tap is what follows it.
func (o Owner) prefix() string { return TablePrefix + o.tag + "_" }

// TableName is the table of o's lock of tap.
func (o Owner) TableName(tap string) string { return o.prefix() + tap }

// GuardTableName is the bridge-family table of o's guard.
func (o Owner) GuardTableName() string { return o.prefix() + "guard" }

// DoorsTableName is the inet-family table that refuses connections to o's
// doors that did not come through the bridge (guard.go).
func (o Owner) DoorsTableName() string { return o.prefix() + "doors" }

// tapOf returns the tap of one of o's lock tables.
func (o Owner) tapOf(table string) (string, bool) {
	tap, ok := strings.CutPrefix(table, o.prefix())
	return tap, ok && tap != ""
}

func (o Owner) table(tap string) *nftables.Table {
	return &nftables.Table{Name: o.TableName(tap), Family: nftables.TableFamilyNetdev}
}

func (o Owner) guardTable() *nftables.Table {
	return &nftables.Table{Name: o.GuardTableName(), Family: nftables.TableFamilyBridge}
}

func (o Owner) doorsTable() *nftables.Table {
	return &nftables.Table{Name: o.DoorsTableName(), Family: nftables.TableFamilyINet}
}
