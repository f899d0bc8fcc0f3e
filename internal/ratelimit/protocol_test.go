package ratelimit

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// TestOperationsDecodeAsEncoded: each op, encoded by op.arg, is what prelude.lua's operation
// decodes (undo_at, cost), and an operation the prelude does not know is an error, never a
// decision.
func TestOperationsDecodeAsEncoded(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Start(t).Addr()})
	t.Cleanup(func() { rdb.Close() })
	decode := redis.NewScript(part(t, "prelude") + `
local undo_at, cost = operation(ARGV[1])
return {undo_at or -1, cost}`)
	tests := []struct {
		op               Op
		undoAt, wantCost int64 // -1: nil, a decision
	}{
		{Op{kind: opDecide}, -1, 1},
		{Op{kind: opAsk}, -1, 0},
		{Op{kind: opCharge, n: 20}, -1, 20},
		{Op{kind: opRefund, n: 2}, -1, -2},
		{Op{kind: opWithdraw, at: 1_764_000_000_123_456}, 1_764_000_000_123_456, 1},
		{Op{kind: opWithdraw}, 0, 1}, // the sorted-set log finds its entry by id
		{GiveOp(1), -1, -1},          // a voucher's grant (package grants)
		{cost(0), -1, 0},
		{cost(1), -1, 1},
		{cost(3), -1, 3},
	}
	for _, tt := range tests {
		got, err := decode.Run(context.Background(), rdb, nil, tt.op.Arg()).Int64Slice()
		if err != nil {
			t.Fatalf("%+v as %q: %v", tt.op, tt.op.Arg(), err)
		}
		if got[0] != tt.undoAt || got[1] != tt.wantCost {
			t.Errorf("%+v as %q decodes to undo_at %d, cost %d; want %d, %d", tt.op, tt.op.Arg(), got[0], got[1], tt.undoAt, tt.wantCost)
		}
	}
	for _, bad := range []string{"x", "c", "c0", "r-1", "n5"} {
		if err := decode.Run(context.Background(), rdb, nil, bad).Err(); err == nil {
			t.Errorf("operation %q decoded without an error", bad)
		}
	}
}
