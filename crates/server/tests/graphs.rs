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
