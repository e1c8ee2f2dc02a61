// A broker that speaks only MQTT v3.1.1, in a few lines over a loopback socket, served from the
// test's own poll loop. mosquitto 2.x accepts v5, so a broker that refuses it has to be made.
// It reads each CONNECT's protocol level (MQTT 3.1.1 §3.1.2.2: byte 7 of a CONNECT whose
// protocol name is "MQTT") and answers the way old brokers do: v3.1.1 (level 4) is accepted
// with CONNACK 0x00; any other level gets `onOtherLevel`.

import BatonLibc
import Glibc

final class OldBroker: LoopPeer {
    enum Answer {
        /// CONNACK return code 0x01 "unacceptable protocol version", then close (MQTT 3.1.1 §3.1.2.2).
        case unacceptableVersion
        /// Close without any CONNACK (also allowed by §3.1.2.2).
        case close
        /// Close every connection, v3.1.1 too, without a CONNACK: a broker that refuses us for
        /// some other reason (at the TLS level, say), not for the protocol version.
        case closeEverything
    }

    let port: Int
    /// The protocol level of every CONNECT received, in order.
    private(set) var levels: [UInt8] = []
    private let listener: Int32
    private let answer: Answer
    private var connections: [(fd: Int32, buffer: [UInt8])] = []

    init(answer: Answer) throws {
        self.answer = answer
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let ok = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { p in
                bind(listener, p, length) == 0 && listen(listener, 8) == 0 && getsockname(listener, p, &length) == 0
            }
        }
        guard listener >= 0, ok else { throw OldBrokerError(errno: Glibc.errno) }
        self.listener = listener
        port = Int(UInt16(bigEndian: address.sin_port))
    }

    deinit {
        for c in connections { close(c.fd) }
        close(listener)
    }

    var pollDescriptors: [pollfd] {
        [pollfd(fd: listener, events: Int16(POLLIN), revents: 0)]
            + connections.map { pollfd(fd: $0.fd, events: Int16(POLLIN), revents: 0) }
    }

    func ready(_ fds: [pollfd]) {
        if fds.first.map(isReadable) == true {
            let fd = accept(listener, nil, nil)
            if fd >= 0 {
                _ = Glibc.fcntl(fd, F_SETFL, Glibc.fcntl(fd, F_GETFL) | O_NONBLOCK)
                connections.append((fd, []))
            }
        }
        var keep: [(fd: Int32, buffer: [UInt8])] = []
        for var c in connections {
            var chunk = [UInt8](repeating: 0, count: 512)
            let n = chunk.withUnsafeMutableBytes { read(c.fd, $0.baseAddress, $0.count) }
            if n == 0 { close(c.fd); continue }
            if n > 0 { c.buffer += chunk[..<n] }
            // CONNECT: 0x10, Remaining Length (1–4 bytes, 7 bits each, §2.2.3), 00 04 "MQTT", level.
            var at = 1
            while at < c.buffer.count, at < 5, c.buffer[at] & 0x80 != 0 { at += 1 }
            let levelAt = at + 1 + 6
            if c.buffer.first == 0x10, c.buffer.count > levelAt {
                let level = c.buffer[levelAt]
                levels.append(level)
                c.buffer.removeAll()
                if level == 4, answer != .closeEverything {
                    send(c.fd, [0x20, 0x02, 0x00, 0x00])
                } else {
                    if case .unacceptableVersion = answer { send(c.fd, [0x20, 0x02, 0x00, 0x01]) }
                    close(c.fd)
                    continue
                }
            }
            keep.append(c)
        }
        connections = keep
    }

    private func send(_ fd: Int32, _ bytes: [UInt8]) {
        _ = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
    }
}

struct OldBrokerError: Error, CustomStringConvertible {
    let errno: Int32
    var description: String { "could not listen on 127.0.0.1: \(String(cString: strerror(Glibc.errno)))" }
}
