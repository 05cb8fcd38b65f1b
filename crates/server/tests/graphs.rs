//! Graphs through a live server on the emulated backend: graphs, their
//! executable forms and nodes are the session's own handles, gone with the
//! graph or the session; another session's are nobody's to this one.

use gpuplex_protocol::calls::*;
use gpuplex_protocol::{CuError, Graph, GraphExec, GraphNode, Stream};

mod common;

use common::*;

/// A graph captured from a stream of its own: one memset of `n` bytes.
fn captured(c: &mut Client, n: u64) -> Graph {
    let s = c.call(cuStreamCreate::Request { flags: 1 }).unwrap().phStream;
    let p = c.alloc(n);
    c.call(StreamBeginCapture::Request { hStream: s, mode: 0 }).unwrap();
    let set =
        Memset::Request { dst: p, pitch: n, value: 7, elementSize: 1, width: n, height: 1, stream: s, sync: false };
    c.call(set).unwrap();
    c.call(StreamEndCapture::Request { hStream: s }).unwrap().graph
}

#[test]
fn a_graph_s_handles_are_its_session_s_and_go_with_it() {
    within_30_s(|| {
        let address = start_server("graphs-handles");
        let mut owner = Client::connect(&address);
        let graph = captured(&mut owner, 64);
        let nodes = owner.call(GraphNodes::Request { hGraph: graph, roots: false }).unwrap().nodes.0;
        assert_eq!(nodes.len(), 1);
        assert_eq!(owner.call(cuGraphNodeGetType::Request { hNode: GraphNode(nodes[0]) }).unwrap().nodeType, 2);
        let exec = owner.call(cuGraphInstantiateWithFlags::Request { hGraph: graph, flags: 0 }).unwrap().phGraphExec;

        let mut other = Client::connect(&address);
        assert_eq!(err(other.call(GraphNodes::Request { hGraph: graph, roots: false })), CuError::INVALID_HANDLE);
        assert_eq!(
            err(other.call(cuGraphNodeGetType::Request { hNode: GraphNode(nodes[0]) })),
            CuError::INVALID_HANDLE
        );
        let launch = cuGraphLaunch::Request { hGraphExec: exec, hStream: Stream::NULL };
        assert_eq!(err(other.call(launch)), CuError::INVALID_HANDLE);
        assert_eq!(err(other.call(cuGraphDestroy::Request { hGraph: graph })), CuError::INVALID_HANDLE);
        let forged = cuGraphLaunch::Request { hGraphExec: GraphExec(0xdead_0000), hStream: Stream::NULL };
        assert_eq!(err(owner.call(forged)), CuError::INVALID_HANDLE);

        owner.call(cuGraphLaunch::Request { hGraphExec: exec, hStream: Stream::NULL }).unwrap();
        owner.call(cuGraphDestroy::Request { hGraph: graph }).unwrap();
        assert_eq!(
            err(owner.call(cuGraphNodeGetType::Request { hNode: GraphNode(nodes[0]) })),
            CuError::INVALID_HANDLE,
            "a graph's nodes go with it"
        );
        owner.call(cuGraphExecDestroy::Request { hGraphExec: exec }).unwrap();
        assert_eq!(err(owner.call(cuGraphExecDestroy::Request { hGraphExec: exec })), CuError::INVALID_HANDLE);
    });
}

#[test]
fn capture_states_and_modes_are_checked() {
    within_30_s(|| {
        let address = start_server("graphs-capture");
        let mut c = Client::connect(&address);
        let s = c.call(cuStreamCreate::Request { flags: 1 }).unwrap().phStream;
        assert_eq!(err(c.call(StreamEndCapture::Request { hStream: s })), CuError::ILLEGAL_STATE, "not capturing");
        assert_eq!(
            err(c.call(StreamBeginCapture::Request { hStream: Stream::NULL, mode: 0 })),
            CuError::STREAM_CAPTURE_UNSUPPORTED,
            "the legacy stream"
        );
        assert_eq!(err(c.call(CaptureMode::Request { mode: 7 })), CuError::INVALID_VALUE);
        c.call(StreamBeginCapture::Request { hStream: s, mode: 0 }).unwrap();
        assert_eq!(err(c.call(StreamBeginCapture::Request { hStream: s, mode: 0 })), CuError::ILLEGAL_STATE);
        let info = c.call(StreamCaptureInfo::Request { hStream: s, edges: true }).unwrap();
        assert_eq!((info.status, info.deps.0.len()), (1, 0));
        assert_eq!(err(c.call(cuStreamSynchronize::Request { hStream: s })), CuError::STREAM_CAPTURE_UNSUPPORTED);
        assert_eq!(err(c.call(StreamEndCapture::Request { hStream: s })), CuError::STREAM_CAPTURE_INVALIDATED);
        // A vanished session's graphs go with it; the server carries on.
        captured(&mut c, 32);
        drop(c);
        let mut after = Client::connect(&address);
        captured(&mut after, 32);
    });
}

/// The session's meter times work with events on its streams, and a
/// hand-over waits for the context: either on a capturing stream would
/// be taken into the capture or break it. While a stream captures, the
/// meter looks, and the capture still ends with its graph.
#[test]
fn the_meter_leaves_a_capturing_stream_alone() {
    within_30_s(|| {
        let address = start_server("graphs-meter");
        let mut c = Client::connect(&address);
        let s = c.call(cuStreamCreate::Request { flags: 1 }).unwrap().phStream;
        let p = c.alloc(64);
        let set = |value| Memset::Request {
            dst: p,
            pitch: 64,
            value,
            elementSize: 1,
            width: 64,
            height: 1,
            stream: s,
            sync: false,
        };
        for round in 0..5 {
            // Fresh work for the meter to time, then a capture it must not touch.
            c.call(set(round)).unwrap();
            c.call(StreamBeginCapture::Request { hStream: s, mode: 0 }).unwrap();
            c.call(set(round + 1)).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(10));
            c.call(set(round + 2)).unwrap();
            let graph = c.call(StreamEndCapture::Request { hStream: s }).unwrap().graph;
            c.call(cuGraphDestroy::Request { hGraph: graph }).unwrap();
        }
    });
}

fn empty_node(c: &mut Client, graph: Graph, deps: Vec<u64>) -> Result<GraphNode, CuError> {
    c.call(GraphAddEmptyNode::Request { graph, deps: gpuplex_protocol::Seq(deps) }).map(|r| r.node)
}

fn kernel_node(
    c: &mut Client,
    graph: Graph,
    func: gpuplex_protocol::Func,
    params: Vec<u8>,
) -> Result<GraphNode, CuError> {
    let req = GraphAddKernelNode::Request {
        graph,
        deps: gpuplex_protocol::Seq(vec![]),
        func,
        gridX: 1,
        gridY: 1,
        gridZ: 1,
        blockX: 4,
        blockY: 1,
        blockZ: 1,
        sharedMem: 0,
        params,
    };
    c.call(req).map(|r| r.node)
}

/// Nodes built by hand are checked as the calls they stand for: a kernel's
/// parameters as a launch's, memsets and copies against the session's
/// memory, dependencies against the same graph's nodes; another session's
/// graphs, nodes and memory are nobody's to this one.
#[test]
fn nodes_built_by_hand_are_checked_as_their_calls() {
    within_30_s(|| {
        use gpuplex_protocol::{Copy3D, CopySide, DevPtr, Seq, COPY_3D, SIDE_DEVICE, SIDE_INLINE};
        let address = start_server("graphs-nodes");
        let mut c = Client::connect(&address);
        let graph = c.call(cuGraphCreate::Request { flags: 0 }).unwrap().phGraph;
        let other_graph = c.call(cuGraphCreate::Request { flags: 0 }).unwrap().phGraph;
        let a = empty_node(&mut c, graph, vec![]).unwrap();
        let stranger = empty_node(&mut c, other_graph, vec![]).unwrap();
        empty_node(&mut c, graph, vec![a.0]).unwrap();
        assert_eq!(empty_node(&mut c, graph, vec![stranger.0]), Err(CuError::INVALID_VALUE), "another graph's node");
        assert_eq!(empty_node(&mut c, graph, vec![0xdead_0000]), Err(CuError::INVALID_HANDLE));
        assert_eq!(empty_node(&mut c, graph, vec![a.0; 5000]), Err(CuError::INVALID_VALUE), "too many");
        let uneven = GraphDependencies::Request {
            graph,
            from: Seq(vec![a.0]),
            to: Seq(vec![]),
            data: Seq(vec![]),
            remove: false,
        };
        assert_eq!(err(c.call(uneven)), CuError::INVALID_VALUE);

        let spin = c.function(LAUNCH_PTX, "spin");
        let p = c.alloc(64);
        kernel_node(&mut c, graph, spin, spin_params(p, 1)).unwrap();
        assert_eq!(kernel_node(&mut c, graph, spin, vec![0; 3]), Err(CuError::INVALID_VALUE), "short parameters");
        let set = |dst: DevPtr, width: u64| GraphAddMemsetNode::Request {
            graph,
            deps: Seq(vec![]),
            dst,
            pitch: 0,
            value: 1,
            elementSize: 4,
            width,
            height: 1,
        };
        c.call(set(p, 16)).unwrap();
        assert_eq!(err(c.call(set(p, 17))), CuError::INVALID_VALUE, "past the allocation");
        let side = |kind, at| CopySide { kind, at, block: 0, x: 0, y: 0, z: 0, pitch: 0, height: 0 };
        let copy = |src, dst, width| GraphAddMemcpyNode::Request {
            graph,
            deps: Seq(vec![]),
            copy: Copy3D { shape: COPY_3D, src, dst, width, height: 1, depth: 1 },
        };
        let q = c.alloc(64);
        c.call(copy(side(SIDE_DEVICE, p.0), side(SIDE_DEVICE, q.0), 64)).unwrap();
        assert_eq!(err(c.call(copy(side(SIDE_DEVICE, p.0), side(SIDE_DEVICE, q.0), 65))), CuError::INVALID_VALUE);
        assert_eq!(err(c.call(copy(side(SIDE_INLINE, 0), side(SIDE_DEVICE, q.0), 8))), CuError::NOT_SUPPORTED);

        // Another session: none of these graphs, nodes or ranges are its own.
        // Handles are numbers of each session's own, so one of this session's
        // may name nothing there or something else of the other's: either
        // way, nothing of this session's is touched.
        let nodes = |c: &mut Client| c.call(GraphNodes::Request { hGraph: graph, roots: false }).unwrap().nodes.0;
        let before = nodes(&mut c);
        let mut other = Client::connect(&address);
        let own = other.call(cuGraphCreate::Request { flags: 0 }).unwrap().phGraph;
        let _ = empty_node(&mut other, graph, vec![]);
        let _ = empty_node(&mut other, own, vec![a.0]);
        let _ = other.call(GraphAddChildGraphNode::Request { graph: own, deps: Seq(vec![]), child: graph });
        let _ = other.call(cuGraphDestroyNode::Request { hNode: a });
        let theirs = GraphAddMemsetNode::Request { graph: own, ..set(p, 4) };
        assert_eq!(err(other.call(theirs)), CuError::INVALID_VALUE, "another session's memory");
        assert_eq!(nodes(&mut c), before, "the graph is as it was");

        // What was built runs.
        let exec = c.call(cuGraphInstantiateWithFlags::Request { hGraph: graph, flags: 0 }).unwrap().phGraphExec;
        c.call(cuGraphLaunch::Request { hGraphExec: exec, hStream: Stream::NULL }).unwrap();
        c.call(cuStreamSynchronize::Request { hStream: Stream::NULL }).unwrap();
        let edges = c.call(GraphEdges::Request { graph }).unwrap();
        assert_eq!((edges.from.0, edges.to.0.len()), (vec![a.0], 1));
    });
}

/// A graph's host node runs in the guest: the server asks for it on the
/// guest's host-call connection and waits for the answer. Without that
/// connection, a host node is refused; once it is gone, host nodes are
/// skipped and graphs still run to their end.
#[test]
fn host_nodes_run_in_the_guest_and_a_vanished_guest_does_not_stall_the_graph() {
    within_30_s(|| {
        use gpuplex_protocol::{codec, Header, HostCallRun, HostCallsOffer, LaneJoin, Opcode, Seq, HOST_CALLS_LANE};
        let address = start_server("graphs-host");
        let mut c = Client::connect(&address);
        let graph = c.call(cuGraphCreate::Request { flags: 0 }).unwrap().phGraph;
        let host = |c: &mut Client| c.call(GraphAddHostNode::Request { graph, deps: Seq(vec![]), id: 7 });
        assert_eq!(err(host(&mut c)), CuError::INVALID_VALUE, "no host-call connection yet");

        let offer: HostCallsOffer = c.session_request(Opcode::OpenHostCalls);
        let join = |key: [u8; 32]| {
            let mut carrier = gpuplex_transport::connect(&address, None).unwrap();
            let payload = codec::encode(&LaneJoin { key, index: HOST_CALLS_LANE });
            carrier.send(&Header::request(Opcode::JoinLane, 1, 0, payload.len()), &payload).unwrap();
            let status = carrier.recv(&mut Vec::new()).unwrap().status.get();
            (carrier, status)
        };
        assert_ne!(join([9; 32]).1, 0, "a wrong key is refused");
        let (mut calls, status) = join(offer.key);
        assert_eq!(status, 0);
        assert_ne!(join(offer.key).1, 0, "one host-call connection per session");
        host(&mut c).unwrap();
        let exec = c.call(cuGraphInstantiateWithFlags::Request { hGraph: graph, flags: 0 }).unwrap().phGraphExec;

        // The guest's side: answer the one host call the launch makes.
        let answering = std::thread::spawn(move || {
            let mut buf = Vec::new();
            let h = calls.recv(&mut buf).unwrap();
            assert_eq!(h.opcode.get(), Opcode::HostCall as u16);
            assert_eq!(codec::decode::<HostCallRun>(&buf).unwrap().id, 7);
            calls.send(&Header::reply(&h, 0, 0), &[]).unwrap();
            calls
        });
        c.call(cuGraphLaunch::Request { hGraphExec: exec, hStream: Stream::NULL }).unwrap();
        c.call(cuStreamSynchronize::Request { hStream: Stream::NULL }).unwrap();
        drop(answering.join().unwrap());
        // The connection is gone: the next launch runs to its end regardless.
        c.call(cuGraphLaunch::Request { hGraphExec: exec, hStream: Stream::NULL }).unwrap();
        c.call(cuStreamSynchronize::Request { hStream: Stream::NULL }).unwrap();
    });
}

/// A cycle is refused at instantiation; child graphs are copied in, so
/// nesting them cannot make a graph grow without bound; a graph cloned
/// after one of its captured nodes was destroyed clones without it.
#[test]
fn hostile_graph_shapes_fail_alone() {
    within_30_s(|| {
        use gpuplex_protocol::Seq;
        let address = start_server("graphs-hostile");
        let mut c = Client::connect(&address);
        let graph = c.call(cuGraphCreate::Request { flags: 0 }).unwrap().phGraph;
        let a = empty_node(&mut c, graph, vec![]).unwrap();
        let b = empty_node(&mut c, graph, vec![a.0]).unwrap();
        let back = GraphDependencies::Request {
            graph,
            from: Seq(vec![b.0]),
            to: Seq(vec![a.0]),
            data: Seq(vec![]),
            remove: false,
        };
        c.call(back).unwrap();
        let instantiate = cuGraphInstantiateWithFlags::Request { hGraph: graph, flags: 0 };
        assert_eq!(err(c.call(instantiate)), CuError::INVALID_VALUE, "a cycle");

        // Each level holds the one below twice: the copies stop growing at a bound.
        let mut level = c.call(cuGraphCreate::Request { flags: 0 }).unwrap().phGraph;
        empty_node(&mut c, level, vec![]).unwrap();
        let mut refused = None;
        for depth in 0..40 {
            let up = c.call(cuGraphCreate::Request { flags: 0 }).unwrap().phGraph;
            let child = |c: &mut Client| {
                c.call(GraphAddChildGraphNode::Request { graph: up, deps: Seq(vec![]), child: level }).map(drop)
            };
            if let Err(e) = child(&mut c).and_then(|()| child(&mut c)) {
                refused = Some((depth, e));
                break;
            }
            level = up;
        }
        let (depth, e) = refused.expect("nesting is bounded");
        assert_eq!(e, CuError::OUT_OF_MEMORY, "refused at depth {depth}");

        // Captured, a node destroyed, the capture's next node added, cloned.
        let s = c.call(cuStreamCreate::Request { flags: 1 }).unwrap().phStream;
        let p = c.alloc(64);
        let set = Memset::Request {
            dst: p,
            pitch: 64,
            value: 1,
            elementSize: 1,
            width: 64,
            height: 1,
            stream: s,
            sync: false,
        };
        c.call(StreamBeginCapture::Request { hStream: s, mode: 0 }).unwrap();
        c.call(set.clone()).unwrap();
        let info = c.call(StreamCaptureInfo::Request { hStream: s, edges: false }).unwrap();
        c.call(cuGraphDestroyNode::Request { hNode: GraphNode(info.deps.0[0]) }).unwrap();
        c.call(set).unwrap();
        let captured = c.call(StreamEndCapture::Request { hStream: s }).unwrap().graph;
        c.call(cuGraphClone::Request { originalGraph: captured }).unwrap();
        assert!(c.free_memory() > 0, "the server carries on");
    });
}

#[test]
fn a_child_graph_is_replaced_only_in_an_executable_graph_and_by_one_of_its_shape() {
    within_30_s(|| {
        use gpuplex_protocol::Seq;
        let address = start_server("graphs-child-set");
        let mut c = Client::connect(&address);
        let graph_of = |c: &mut Client, nodes: usize| {
            let g = c.call(cuGraphCreate::Request { flags: 0 }).unwrap().phGraph;
            for _ in 0..nodes {
                empty_node(c, g, vec![]).unwrap();
            }
            g
        };
        let (one, other_one, two) = (graph_of(&mut c, 1), graph_of(&mut c, 1), graph_of(&mut c, 2));
        let parent = graph_of(&mut c, 0);
        let child =
            c.call(GraphAddChildGraphNode::Request { graph: parent, deps: Seq(vec![]), child: one }).unwrap().node;
        let exec = c.call(cuGraphInstantiateWithFlags::Request { hGraph: parent, flags: 0 }).unwrap().phGraphExec;
        let set = |c: &mut Client, exec: GraphExec, with: Graph| {
            c.call(GraphChildNodeSetParams::Request { node: child, exec, child: with }).map(drop)
        };
        assert_eq!(set(&mut c, exec, other_one), Ok(()));
        assert_eq!(err(set(&mut c, exec, two)), CuError::INVALID_VALUE, "another shape");
        assert_eq!(err(set(&mut c, GraphExec(0), other_one)), CuError::INVALID_VALUE, "in the graph itself");
        c.call(cuGraphLaunch::Request { hGraphExec: exec, hStream: Stream::NULL }).unwrap();
    });
}

fn conditional(
    c: &mut Client,
    graph: Graph,
    handle: u64,
    kind: u32,
    size: u32,
) -> Result<(GraphNode, Vec<Graph>), CuError> {
    let req =
        GraphAddConditionalNode::Request { graph, deps: gpuplex_protocol::Seq(vec![]), handle, kind, size, ctx: c.ctx };
    c.call(req).map(|r| (r.node, r.bodies.0.into_iter().map(Graph).collect()))
}

fn memset_node(c: &mut Client, graph: Graph, dst: gpuplex_protocol::DevPtr, value: u32) -> GraphNode {
    let req = GraphAddMemsetNode::Request {
        graph,
        deps: gpuplex_protocol::Seq(vec![]),
        dst,
        pitch: 4,
        value,
        elementSize: 1,
        width: 4,
        height: 1,
    };
    c.call(req).unwrap().node
}

/// A conditional node's body graphs are session handles that belong to the
/// node: refused to cuGraphDestroy, gone with the node or its graph, and
/// nobody's in another session. On the emulated device an if node runs the
/// body its handle's default picks.
#[test]
fn conditional_bodies_belong_to_their_node() {
    within_30_s(|| {
        let address = start_server("graphs-conditional");
        let mut c = Client::connect(&address);
        let graph = c.call(cuGraphCreate::Request { flags: 0 }).unwrap().phGraph;
        let handle_for = |c: &mut Client, default: u32| {
            let req = cuGraphConditionalHandleCreate::Request {
                hGraph: graph,
                ctx: c.ctx,
                defaultLaunchValue: default,
                flags: 1,
            };
            c.call(req).unwrap().pHandle_out
        };
        let (yes, no) = (handle_for(&mut c, 1), handle_for(&mut c, 0));
        assert_eq!(err(conditional(&mut c, graph, yes, 0, 3)), CuError::INVALID_VALUE, "an if node has 1 or 2 bodies");
        assert_eq!(err(conditional(&mut c, graph, yes, 9, 1)), CuError::INVALID_VALUE, "no such kind");
        assert_eq!(err(conditional(&mut c, graph, 0xbad, 0, 1)), CuError::INVALID_VALUE, "no such handle");

        let p = c.alloc(8);
        c.write(p, &[0; 8]);
        let (_, taken) = conditional(&mut c, graph, yes, 0, 2).unwrap();
        let (second, skipped) = conditional(&mut c, graph, no, 0, 1).unwrap();
        assert_eq!((taken.len(), skipped.len()), (2, 1));
        memset_node(&mut c, taken[0], p, 7);
        memset_node(&mut c, taken[1], p, 9);
        memset_node(&mut c, skipped[0], gpuplex_protocol::DevPtr(p.0 + 4), 5);
        let exec = c.call(cuGraphInstantiateWithFlags::Request { hGraph: graph, flags: 0 }).unwrap().phGraphExec;
        c.call(cuGraphLaunch::Request { hGraphExec: exec, hStream: Stream::NULL }).unwrap();
        c.call(cuCtxSynchronize::Request {}).unwrap();
        assert_eq!(c.read(p, 8), [7, 7, 7, 7, 0, 0, 0, 0], "the if body ran, not its else, nor the false one");

        assert_eq!(err(c.call(cuGraphDestroy::Request { hGraph: taken[0] })), CuError::INVALID_VALUE);
        let mut other = Client::connect(&address);
        assert_eq!(err(other.call(GraphNodes::Request { hGraph: taken[0], roots: false })), CuError::INVALID_HANDLE);

        c.call(cuGraphDestroyNode::Request { hNode: second }).unwrap();
        assert_eq!(
            err(c.call(GraphNodes::Request { hGraph: skipped[0], roots: false })),
            CuError::INVALID_HANDLE,
            "a body goes with its node"
        );
        assert_eq!(c.call(GraphNodes::Request { hGraph: taken[1], roots: false }).unwrap().nodes.0.len(), 1);
        c.call(cuGraphExecDestroy::Request { hGraphExec: exec }).unwrap();

        // A while node that never ends would hold the test device forever.
        let forever = c.call(cuGraphCreate::Request { flags: 0 }).unwrap().phGraph;
        conditional(&mut c, forever, yes, 1, 1).unwrap();
        let exec = c.call(cuGraphInstantiateWithFlags::Request { hGraph: forever, flags: 0 }).unwrap().phGraphExec;
        assert_eq!(
            err(c.call(cuGraphLaunch::Request { hGraphExec: exec, hStream: Stream::NULL })),
            CuError::NOT_SUPPORTED
        );
        assert_eq!(c.read(p, 4), [7, 7, 7, 7], "the session carries on");

        c.call(cuGraphDestroy::Request { hGraph: graph }).unwrap();
        assert_eq!(
            err(c.call(GraphNodes::Request { hGraph: taken[1], roots: false })),
            CuError::INVALID_HANDLE,
            "and with its node's graph"
        );
    });
}
