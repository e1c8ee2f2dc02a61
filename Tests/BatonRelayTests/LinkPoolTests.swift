// The relays' link slots (`LinkPool`) and the channel's pull reading (`LinkChannel.next`),
// on Unix SOCK_SEQPACKET pairs: the far end is a phone on a re-advertised activity's link
// (docs/relay.md §9, the gateway plays the device), played byte for byte (protocol.md §5.1).

import BatonLibc
import Glibc
import CBlueZ  // its shim includes <sys/socket.h>: import it so SOCK_SEQPACKET has one owner
import Testing
import BatonTestSupport
@testable import BatonRelay

/// A relay's state for one link, as the pool hands it out.
private final class Tag {
    var name = ""
    var owes = false
}

/// A pair: the gateway's end (made an open channel by `channel`), the phone's end
/// (non-blocking) for the test.
private func makePair() throws -> (gateway: Int32, phone: Int32) {
    var pair: [Int32] = [-1, -1]
    try #require(socketpair(AF_UNIX, Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &pair) == 0)
    _ = Glibc.fcntl(pair[1], F_SETFL, Glibc.fcntl(pair[1], F_GETFL) | O_NONBLOCK)
    return (pair[0], pair[1])
}

/// A link a phone opened, as the gateway's listener accepted it: open at once.
private func channel(_ fd: Int32) -> LinkChannel { LinkChannel(accepted: fd, peer: nil, l2cap: false, sendMTU: 100) }

private func write(_ fd: Int32, _ bytes: [UInt8]) {
    _ = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
}

private enum Received: Equatable {
    case record([UInt8])
    case end
    case error(Int32)
}

/// What the phone reads next.
private func receive(_ fd: Int32) -> Received {
    var buffer = [UInt8](repeating: 0, count: 256)
    let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
    if n < 0 { return .error(Glibc.errno) }
    return n == 0 ? .end : .record(Array(buffer[..<n]))
}

@Suite("Link slots and pull reading (docs/relay.md §5)")
struct LinkPoolTests {
    @Test("Capacity + 1: a full pool takes no link; a freed slot takes the next, under a new serial; every entry was made at start")
    func capacityPlusOne() throws {
        var made = 0
        var pool = LinkPool<Tag>(capacity: 2) { _ in made += 1; return Tag() }
        let (count0, full0) = (pool.count, pool.isFull)
        #expect(made == 2 && count0 == 0 && !full0)
        var phones: [Int32] = []
        defer { for p in phones { close(p) } }
        var serials: [UInt64] = []
        for name in ["reader", "tablet"] {
            let pair = try makePair()
            phones.append(pair.phone)
            let (slot, tag) = pool.add(channel(pair.gateway))
            tag.name = name
            let serial = pool.serial(slot)
            serials.append(try #require(serial))
        }
        let (count2, full2) = (pool.count, pool.isFull)
        #expect(full2 && count2 == 2)
        let tablet = pool.first { $0.name == "tablet" }, readerSlot = pool.slot(serial: serials[0])
        #expect(tablet == 1)
        #expect(readerSlot == 0)

        let first = pool[0]
        pool.close(0)
        let (entry, serial, found) = (pool[0], pool.serial(0), pool.slot(serial: serials[0]))
        #expect(entry == nil && serial == nil && found == nil)
        let (count1, full1) = (pool.count, pool.isFull)
        #expect(!full1 && count1 == 1)
        // The phone sees the hang-up: EOF.
        #expect(receive(phones[0]) == .end)

        let pair = try makePair()
        phones.append(pair.phone)
        let (slot, tag) = pool.add(channel(pair.gateway))
        #expect(slot == 0)
        #expect(tag === first, "the slot's entry is reused, not made again")
        #expect(made == 2)
        let newSerial = pool.serial(0)
        #expect(newSerial! > serials[1])
    }

    @Test("Readiness is the link's, not the slot's: a link closed and another opened in its slot between poll() and the readiness is not read as the old one")
    func readinessFollowsTheSerial() throws {
        var pool = LinkPool<Tag>(capacity: 2) { _ in Tag() }
        let a = try makePair(), b = try makePair()
        defer { close(a.phone); close(b.phone) }
        _ = pool.add(channel(a.gateway))
        let (_, second) = pool.add(channel(b.gateway))
        second.owes = true
        var fds: [pollfd] = []
        pool.pollDescriptors(into: &fds) { $0.owes }
        #expect(fds.map { $0.events } == [Int16(POLLIN), Int16(POLLIN | POLLOUT)], "POLLOUT only where the entry owes a send")
        fds[0].revents = Int16(POLLIN)
        fds[1].revents = 0
        let (first, second2) = (pool.ready(0, fds[0]), pool.ready(1, fds[1]))
        #expect(first == 0)
        #expect(second2 == nil, "nothing came back for it")
        pool.close(0)
        let c = try makePair()
        defer { close(c.phone) }
        let added = pool.add(channel(c.gateway)).slot
        let stale = pool.ready(0, fds[0])
        #expect(added == 0)
        #expect(stale == nil, "the new link in slot 0 did not become readable")
    }

    @Test("§5.1: next hands out one SDU at a time; the caller sends between two; hangUp drops what is unread, says its last words, and the phone sees an end, not a reset")
    func pullThenHangUp() throws {
        let pair = try makePair()
        let phone = pair.phone
        defer { close(phone) }
        var link = channel(pair.gateway)
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 64, alignment: 8)
        defer { buffer.deallocate() }
        write(phone, hx("01 07 00"))        // fetch seq 7
        write(phone, hx("01 08 00"))        // fetch seq 8
        write(phone, hx("01 09 00"))        // fetch seq 9
        let early = link.next(into: buffer)
        #expect(early == nil, "nothing is read before poll() says readable")
        link.ready(readable: true, writable: false, buffer: buffer)
        let seven = link.next(into: buffer).map { Array($0) }
        #expect(seven == hx("01 07 00"))
        // Between two messages the channel is free: an answer goes out at once.
        let sent = try hx("02 07 00 A1").withUnsafeBytes { try link.send($0) }   // payload seq 7: A1
        #expect(sent)
        #expect(receive(phone) == .record(hx("02 07 00 A1")))
        let eight = link.next(into: buffer).map { Array($0) }
        #expect(eight == hx("01 08 00"))
        // fetch-refused seq 8, 03 refused
        hx("03 08 00 03").withUnsafeBytes { link.hangUp(lastWords: $0, buffer: buffer) }
        let (state, fd) = (link.state, link.fd)
        #expect(state == .closed(nil) && fd == -1)
        #expect(receive(phone) == .record(hx("03 08 00 03")))
        #expect(receive(phone) == .end, "EOF: the unread fetch 9 was read and dropped, so no ECONNRESET")
    }
}
