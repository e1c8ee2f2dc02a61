// The gateway's loop for the MQTT tests (TestLoop): one real poll() over the clients' sockets
// (POLLIN, plus POLLOUT while `wantsWrite`) and any other descriptors a test serves, with the
// timeout from the nearest `nextDeadline` (architecture.md §5.7). Every test drives
// MQTTClient through it, so the client is exercised exactly as `baton gateway` will drive it.

import BatonLibc
import BatonMQTT
import BatonTestSupport
import Glibc

/// A client's observable state, copied out (the client is `~Copyable`: `#expect` and the
/// loop's `until` closure cannot hold it).
struct ClientState {
    var socket: Int32
    var wantsWrite: Bool
    var isConnected: Bool
    var protocolVersion: MQTTProtocol?
    var nextDeadline: Instant?
    var counters: MQTTCounters

    init(_ c: borrowing MQTTClient) {
        socket = c.socket
        wantsWrite = c.wantsWrite
        isConnected = c.isConnected
        protocolVersion = c.protocolVersion
        nextDeadline = c.nextDeadline
        counters = c.counters
    }
}

/// What one client's `poll` delivered, in order, and its state after the last turn.
final class EventLog {
    var events: [MQTTEvent] = []
    var state: ClientState?
    var isConnected: Bool { state?.isConnected ?? false }

    var connects: [MQTTProtocol] {
        events.compactMap { if case .connected(let version, _) = $0 { version } else { nil } }
    }
    var refusals: [String] {
        events.compactMap { if case .refused(let reason) = $0 { reason } else { nil } }
    }
    var disconnects: [String] {
        events.compactMap { if case .disconnected(let reason) = $0 { reason } else { nil } }
    }
    var messages: [MQTTMessage] {
        events.compactMap { if case .message(let m) = $0 { m } else { nil } }
    }
}

/// Other descriptors in the same poll(): a fake broker, say.
protocol LoopPeer: AnyObject {
    /// The descriptors and events to poll this turn.
    var pollDescriptors: [pollfd] { get }
    /// The same descriptors with `revents` filled in.
    func ready(_ fds: [pollfd])
}

/// Runs the loop for `a` and `b` (and `peer`) until `done()` holds or `limit` passes; returns
/// whether `done()` held. Generous limits: these are real processes on a shared machine.
@discardableResult
func runLoop(_ a: inout MQTTClient, _ logA: EventLog, _ b: inout MQTTClient, _ logB: EventLog,
             peer: (any LoopPeer)? = nil, limit: Duration = .seconds(5), until done: () -> Bool) -> Bool {
    logA.state = ClientState(a)
    logB.state = ClientState(b)
    // The gateway's driver (BatonLibc's PollLoop), with the two clients and the peer as parts.
    var loop = TestLoop(parts: 3, descriptors: 16)
    return loop.run(limit: limit, until: done) { driver in
        let partA = driver.add(&a)
        let partB = driver.add(&b)
        var peerFDs = DescriptorList(peer?.pollDescriptors ?? [])
        let peerPart = driver.add(&peerFDs)
        let after = driver.wait()
        a.poll(now: after, ready: driver.ready(partA)) { logA.events.append($0) }
        b.poll(now: after, ready: driver.ready(partB)) { logB.events.append($0) }
        logA.state = ClientState(a)
        logB.state = ClientState(b)
        peer?.ready(Array(driver.ready(peerPart)))
    }
}

/// The loop for one client.
@discardableResult
func runLoop(_ a: inout MQTTClient, _ log: EventLog, peer: (any LoopPeer)? = nil, limit: Duration = .seconds(5),
             until done: () -> Bool) -> Bool {
    // A client never started has no socket and no deadline: it only fills the second slot.
    var idle = try! MQTTClient(config: MQTTConfig(clientID: "idle"))
    return runLoop(&a, log, &idle, EventLog(), peer: peer, limit: limit, until: done)
}

/// POLLERR and POLLHUP count as readable: the read is what reports the error.
func isReadable(_ p: pollfd) -> Bool { p.revents & Int16(POLLIN | POLLERR | POLLHUP) != 0 }
func isWritable(_ p: pollfd) -> Bool { p.revents & Int16(POLLOUT) != 0 }
