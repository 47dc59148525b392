package node_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/node/nodetest"
)

// dialPlain dials addr in plaintext, with extra options, and closes the
// connection at the end of the test.
func dialPlain(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// wantCode fails the test unless err has code want and its message holds
// every part of wantMsg.
func wantCode(t *testing.T, what string, err error, want codes.Code, wantMsg ...string) {
	t.Helper()
	if status.Code(err) != want {
		t.Errorf("%s: %v, want %v", what, err, want)
		return
	}
	for _, m := range wantMsg {
		if !strings.Contains(status.Convert(err).Message(), m) {
			t.Errorf("%s: %q lacks %q", what, status.Convert(err).Message(), m)
		}
	}
}

// TestOutsiderCannotActAsPeerOrAdmin: in a cluster in its default
// configuration (members sign their calls with the cluster keys; no admin
// token given), a caller that reaches the gRPC port to send checks can call
// neither the Peer service (close partitions by an Acquire naming the node
// itself, make a node drop partitions, forge sends through a backup, hand
// back) nor the Admin service (lift every limit, delete the operator's
// overrides): every call is refused with UNAUTHENTICATED, counted, and
// the cluster goes on deciding with every partition open.
func TestOutsiderCannotActAsPeerOrAdmin(t *testing.T) {
	ctx := context.Background()
	lc, err := nodetest.Start(ctx, nodetest.Config{Size: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	target := lc.Members()[0]
	conn := dialPlain(t, target.Addr)
	ring, err := pb.NewLimiterClient(conn).Ring(ctx, &pb.RingRequest{})
	if err != nil {
		t.Fatal(err)
	}
	epoch := ring.Epoch
	var all []uint32
	for p := range 271 {
		all = append(all, uint32(p))
	}
	peer, admin := pb.NewPeerClient(conn), pb.NewAdminClient(conn)
	other := lc.Members()[1].Name
	calls := map[string]func() error{
		"Acquire naming the node itself": func() error {
			_, err := peer.Acquire(ctx, &pb.AcquireRequest{Node: target.Name, RingEpoch: epoch, Partitions: all})
			return err
		},
		"Acquire naming another member": func() error {
			_, err := peer.Acquire(ctx, &pb.AcquireRequest{Node: other, RingEpoch: epoch, Partitions: all})
			return err
		},
		"Release": func() error {
			_, err := peer.Release(ctx, &pb.ReleaseRequest{Node: other, RingEpoch: epoch, Partitions: all})
			return err
		},
		"Replicate": func() error {
			_, err := peer.Replicate(ctx, &pb.ReplicateRequest{Node: other, RingEpoch: epoch})
			return err
		},
		"ReplicateStream": func() error {
			st, err := peer.ReplicateStream(ctx)
			if err != nil {
				return err
			}
			if err := st.Send(&pb.ReplicateRequest{Node: other, RingEpoch: epoch, CallId: 1}); err != nil {
				return err
			}
			_, err = st.Recv()
			return err
		},
		"Fill": func() error {
			_, err := peer.Fill(ctx, &pb.FillRequest{Node: other, RingEpoch: epoch})
			return err
		},
		"Handback": func() error {
			_, err := peer.Handback(ctx, &pb.HandbackRequest{Node: other, RingEpoch: epoch, Partitions: all})
			return err
		},
		"Forward": func() error {
			_, err := peer.Forward(ctx, &pb.CheckRequest{Recipients: []string{"+8613800000000"}})
			return err
		},
		"SetOverride exempting everyone": func() error {
			_, err := admin.SetOverride(ctx, &pb.OverrideSetRequest{Override: &pb.Override{Name: "all", Domain: "default", Prefixes: []string{"+"}, Exempt: true, Version: 1 << 62}})
			return err
		},
		"DeleteOverride": func() error {
			_, err := admin.DeleteOverride(ctx, &pb.OverrideDeleteRequest{Name: "vip"})
			return err
		},
		"ListOverrides": func() error {
			_, err := admin.ListOverrides(ctx, &pb.OverrideListRequest{})
			return err
		},
	}
	for what, call := range calls {
		err := call()
		wantCode(t, what, err, codes.Unauthenticated)
		// Each refusal names the service refused and what it wants.
		admin := strings.Contains(what, "Override")
		if msg := status.Convert(err).Message(); admin != strings.Contains(msg, "the Admin service") || !admin != strings.Contains(msg, "the Peer service") {
			t.Errorf("%s: %q names the wrong service", what, msg)
		}
	}
	st := target.Node.Stats()
	if st.RefusedPeerCalls != 8 || st.RefusedAdminCalls != 3 {
		t.Errorf("refused calls counted: peer %d, admin %d; want 8 and 3", st.RefusedPeerCalls, st.RefusedAdminCalls)
	}
	if st.Ring.Moving != 0 {
		t.Fatalf("%d partitions moving after the refused calls", st.Ring.Moving)
	}
	// The node still decides for every partition it owns: 600 recipients
	// spread over all of them, each admitted once.
	req := &pb.CheckRequest{}
	for i := range 600 {
		req.Recipients = append(req.Recipients, fmt.Sprintf("+86138%08d", i))
	}
	resp, err := pb.NewLimiterClient(conn).Check(ctx, req)
	if err != nil || len(resp.Errors) > 0 {
		t.Fatalf("checks after the refused calls: %v %v", err, resp.GetErrors())
	}
	if l, err := target.Node.ListOverrides(ctx, nil); err != nil || len(l.Overrides) != 0 {
		t.Fatalf("overrides after the refused calls: %v %v", l.GetOverrides(), err)
	}
}

// TestMemberCannotActAsAnother: a call signed with the cluster keys names
// its signer; a Peer request that names another member is refused
// (PERMISSION_DENIED), and an Acquire that names the receiving node itself,
// signed as it, is refused by the handler: no member acquires from itself.
func TestMemberCannotActAsAnother(t *testing.T) {
	ctx := context.Background()
	keys := node.StaticKeys{[]byte("0123456789abcdef0123456789abcdef")}
	lc, err := nodetest.Start(ctx, nodetest.Config{Size: 2, PeerKeys: keys})
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	target, other := lc.Members()[0], lc.Members()[1]
	epoch := target.Node.Ring().Epoch()
	signedAs := func(name string) pb.PeerClient {
		return pb.NewPeerClient(dialPlain(t, target.Addr, grpc.WithPerRPCCredentials(node.PeerCallCredentials(name, keys))))
	}
	_, err = signedAs(other.Name).Acquire(ctx, &pb.AcquireRequest{Node: "node-7", RingEpoch: epoch, Partitions: []uint32{0}})
	wantCode(t, "Acquire signed by one member naming another", err, codes.PermissionDenied, `signed by member "node-1"`, `names "node-7"`)
	st, err := signedAs(other.Name).ReplicateStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&pb.ReplicateRequest{Node: target.Name, RingEpoch: epoch, CallId: 1}); err != nil {
		t.Fatal(err)
	}
	_, err = st.Recv()
	wantCode(t, "ReplicateStream message naming another member", err, codes.PermissionDenied)
	_, err = signedAs(target.Name).Acquire(ctx, &pb.AcquireRequest{Node: target.Name, RingEpoch: epoch, Partitions: []uint32{0}})
	wantCode(t, "Acquire from itself", err, codes.FailedPrecondition, "never acquires from itself")
	_, err = signedAs(target.Name).Release(ctx, &pb.ReleaseRequest{Node: target.Name, RingEpoch: epoch, Partitions: []uint32{0}})
	wantCode(t, "Release to itself", err, codes.FailedPrecondition, "never releases to itself")
	// Signed with a key the cluster lacks.
	stranger := pb.NewPeerClient(dialPlain(t, target.Addr, grpc.WithPerRPCCredentials(node.PeerCallCredentials(other.Name, node.StaticKeys{[]byte("another key of the same size....")}))))
	_, err = stranger.Handback(ctx, &pb.HandbackRequest{Node: other.Name, RingEpoch: epoch})
	wantCode(t, "Handback signed with a foreign key", err, codes.Unauthenticated, "verifies under none of this node's 1 cluster keys")
	if target.Node.Stats().Ring.Moving != 0 {
		t.Fatal("partitions moving after the refused calls")
	}
	// A member reads a peer's overrides (SyncOverrides) with its signature.
	if _, err := pb.NewAdminClient(dialPlain(t, target.Addr, grpc.WithPerRPCCredentials(node.PeerCallCredentials(other.Name, keys)))).ListOverrides(ctx, &pb.OverrideListRequest{}); err != nil {
		t.Fatalf("ListOverrides signed by a member: %v", err)
	}
}

// bearerCreds sends an operator's token.
type bearerCreds string

func (b bearerCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}
func (bearerCreds) RequireTransportSecurity() bool { return false }

// TestAdminNeedsOperatorToken: with AdminTokens, SetOverride and
// DeleteOverride take the calls that carry one of them and refuse others,
// and a version far ahead of the node's clock, which no later change could
// outrank, is refused.
func TestAdminNeedsOperatorToken(t *testing.T) {
	ctx := context.Background()
	const token = "s3cret-operator-token"
	lc, err := nodetest.Start(ctx, nodetest.Config{Size: 1, Node: func(cfg *node.Config) { cfg.AdminTokens = node.StaticKeys{[]byte(token)} }})
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	addr := lc.Addrs()[0]
	op := pb.NewAdminClient(dialPlain(t, addr, grpc.WithPerRPCCredentials(bearerCreds(token))))
	wrong := pb.NewAdminClient(dialPlain(t, addr, grpc.WithPerRPCCredentials(bearerCreds("not-the-operator-token"))))
	vip := &pb.Override{Name: "vip", Domain: "default", Prefixes: []string{"+1555"}, Limits: map[string]uint32{"recipient-1m": 1}}
	_, err = wrong.SetOverride(ctx, &pb.OverrideSetRequest{Override: vip})
	wantCode(t, "SetOverride with a wrong token", err, codes.Unauthenticated, "not one of this node's admin tokens")
	_, err = op.SetOverride(ctx, &pb.OverrideSetRequest{Override: &pb.Override{Name: "vip", Domain: "default", Prefixes: []string{"+1555"}, Limits: map[string]uint32{"recipient-1m": 1}, Version: 1 << 62}})
	wantCode(t, "SetOverride versioned 2^62", err, codes.InvalidArgument, "version: 4611686018427387904 is", "ahead of node node-0's clock")
	if _, err := op.SetOverride(ctx, &pb.OverrideSetRequest{Override: vip}); err != nil {
		t.Fatalf("SetOverride with the token: %v", err)
	}
	_, err = wrong.DeleteOverride(ctx, &pb.OverrideDeleteRequest{Name: "vip"})
	wantCode(t, "DeleteOverride with a wrong token", err, codes.Unauthenticated)
	_, err = op.DeleteOverride(ctx, &pb.OverrideDeleteRequest{Name: "vip", Version: 1 << 62})
	wantCode(t, "DeleteOverride versioned 2^62", err, codes.InvalidArgument, "ahead of node node-0's clock")
	if resp, err := op.DeleteOverride(ctx, &pb.OverrideDeleteRequest{Name: "vip"}); err != nil || !resp.Deleted {
		t.Fatalf("DeleteOverride with the token: %v %v", resp, err)
	}
	// Metadata that only looks like a token: a bare one, no "Bearer ".
	bare := metadata.AppendToOutgoingContext(ctx, "authorization", token)
	_, err = pb.NewAdminClient(dialPlain(t, addr)).SetOverride(bare, &pb.OverrideSetRequest{Override: vip})
	wantCode(t, "SetOverride with a bare token", err, codes.Unauthenticated)
}

// TestNameTakenRefusesToStart: a second process that joins under the name of
// a live member (two nodes on one host without --name both take the host
// name) refuses to start, saying to set --name, instead of owning every
// partition alone beside it; the member keeps its ring.
func TestNameTakenRefusesToStart(t *testing.T) {
	ctx := context.Background()
	keys := node.StaticKeys{[]byte("0123456789abcdef0123456789abcdef")}
	lc, err := nodetest.Start(ctx, nodetest.Config{Size: 1, PeerKeys: keys})
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	first := lc.Members()[0]
	g := nodetest.FastGossip()
	g.Join = []string{first.GossipAddr}
	twin, err := node.New(node.Config{Name: first.Name, AdvertiseAddr: "127.0.0.1:1", Cluster: &g, PeerKeys: keys, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	err = twin.Open(ctx)
	if !errors.Is(err, node.ErrNameTaken) || !strings.Contains(err.Error(), "--name") || !strings.Contains(err.Error(), first.Addr) {
		t.Fatalf("Open under a live member's name: %v", err)
	}
	twin.Close()
	if r := first.Node.Ring(); r.Len() != 1 || !r.Has(first.Name) {
		t.Fatalf("the member's ring after the twin's attempt: %v", r.Members())
	}
}
