// Heap allocations per advertisement through the ESPHome API server (docs/esphome.md §5,
// docs/performance.md "The ESPHome proxy"): one Noise client subscribed, `heard` for every
// advertisement and `flush` after every 8 (a loop turn), the client's socket drained between
// turns. The client is this process: it sends the §4.3 vector's hello, handshake and an
// encrypted subscription (the server's ephemeral key is fixed to the vector's, so the
// precomputed bytes are valid), then reads and discards. Counting covers heard, the batch
// framed and encrypted in place, and the send(2) of every turn. Then a connection (docs/esphome.md
// §11): the client connected to a device that notifies, each notification read by
// `GATTConnections` and told to the client through the server, 8 a turn. Exits 1 over the
// budget in Tests/Benchmarks/Thresholds/proxy.json.
import BatonLibc
import BatonProxy
import BatonRelay
import BatonWire
import CBlueZ  // SOCK_SEQPACKET's one owner
import CLibc
import Foundation
import Glibc
import MallocInterposerSwift

func hx(_ s: String) -> [UInt8] {
    let d = s.filter { !$0.isWhitespace }
    return stride(from: 0, to: d.count, by: 2).map { UInt8(d.dropFirst($0).prefix(2), radix: 16)! }
}

let message1 = hx("7b4e909bbe7ffe44c465a220037d608ee35897d31ef972f07f74892cb0f73f13d1bc1a38b6793685dc7e2ffdf8ea0933")
/// SubscribeBluetoothLEAdvertisementsRequest (66), flags 1, the client's first transport message.
let subscribe = hx("086f88d64556c4e2682336a73c990475ec51d41f4b9c")

let arguments = CommandLine.arguments
let measured = arguments.count > 1 ? Int(arguments[1]) ?? 100_000 : 100_000
let budget = arguments.count > 2 ? Double(arguments[2]) ?? 0 : 0

var settings = ProxySettings(encryption: .noise(key: Array(0...31)))
settings.address = "127.0.0.1"
settings.port = 0
let info = DeviceInfo(name: "bench", macAddress: "02:BA:70:00:00:01", esphomeVersion: "2025.5.0", model: "Baton gateway",
                      manufacturer: "Baton", friendlyName: "Bench", bluetoothMacAddress: "02:BA:70:00:00:01", encryptionSupported: true)
var server = try ProxyServer(settings: settings, info: info, compactMAC: "02ba70000001")
server.fixedEphemeralKey = [UInt8](repeating: 0x22, count: 32)

// The client: connect, then the whole opening in one write.
let client = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
var address = sockaddr_in()
address.sin_family = sa_family_t(AF_INET)
address.sin_port = server.port.bigEndian
address.sin_addr.s_addr = inet_addr("127.0.0.1")
precondition(withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
    connect(client, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } } == 0)
let opening: [UInt8] = [1, 0, 0] + [1, 0, 49, 0] + message1 + [1, 0, UInt8(subscribe.count)] + subscribe
precondition(opening.withUnsafeBytes { send(client, $0.baseAddress, $0.count, 0) } == opening.count)
_ = BatonLibc.fcntl(client, F_SETFL, BatonLibc.fcntl(client, F_GETFL) | O_NONBLOCK)

let drain = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 16, alignment: 8)
var drained = 0
@MainActor func drainClient() {
    while true {
        let n = recv(client, drain.baseAddress, drain.count, 0)
        if n <= 0 { return }
        drained += n
    }
}

var loop = PollLoop(parts: 1, descriptors: server.descriptorLimit, longestWait: .milliseconds(20))
for _ in 0..<200 where server.subscriberCount == 0 {
    loop.begin(now: .now)
    let slot = loop.add(&server)
    loop.wait()
    server.handle(ready: loop.ready(slot), now: loop.now)
    server.flush(now: loop.now)
    drainClient()
}
guard server.subscriberCount == 1 else {
    FileHandle.standardError.write("ProxyBench: the client did not subscribe\n".data(using: .utf8)!)
    exit(1)
}

// 150 devices' advertisements, 8 per turn, RSSI moving.
let data: [[UInt8]] = (0..<150).map { d in hx("020106") + [UInt8(27), 0xFF, 0xFF, 0xFF] + (0..<24).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ d) } }
/// Scan responses of the active phase (docs/esphome.md §3.6): a Complete Local Name each.
let names: [[UInt8]] = (0..<150).map { d in [UInt8(12), 0x09] + Array("sensor-\(1000 + d)".utf8) }
/// Passive: ADV_NONCONN_IND only. Active: each device's scannable advertisement (ADV_IND in an
/// extended report, 0x13), then its scan response (0x1B), merged by the server.
@MainActor func turns(_ count: Int, active: Bool = false) {
    var i = 0
    while i < count {
        let d = (active ? i / 2 : i) % data.count
        let address = 0xC0FF_EE00_0000 | UInt64(d), rssi = Int8(-40 - (i & 31))
        if !active {
            data[d].withUnsafeBytes { server.heard(address: address, addressType: 1, rssi: rssi, data: $0) }
        } else if i & 1 == 0 {
            data[d].withUnsafeBytes { server.heard(address: address, addressType: 1, rssi: rssi, data: $0, eventType: 0x13) }
        } else {
            names[d].withUnsafeBytes { server.heard(address: address, addressType: 1, rssi: rssi, data: $0, eventType: 0x1B) }
        }
        i += 1
        if i & 7 == 0 {
            server.flush(now: .now)
            drainClient()
        }
    }
    server.flush(now: .now)
    drainClient()
}

/// Proves the counter counts (as GatewayBench does): 1,000 objects while counting. A counter
/// not wired in would say 0 here, and a 0 for the server would then mean nothing.
@MainActor func calibrate() -> Int {
    final class Box { let value: Int; init(_ value: Int) { self.value = value } }
    var boxes: [Box] = []
    boxes.reserveCapacity(1000)
    MallocInterposerSwift.initialize()
    MallocInterposerSwift.hook()
    for i in 0..<1000 { boxes.append(Box(i)) }
    MallocInterposerSwift.unhook()
    precondition(boxes.count == 1000)
    return MallocInterposerSwift.getStatistics().mallocCount
}
let calibration = calibrate()
guard calibration >= 1000 else {
    FileHandle.standardError.write("ProxyBench: the malloc counter saw \(calibration) allocations for 1000 objects\n".data(using: .utf8)!)
    exit(1)
}

turns(5_000)  // warm-up: every path once
let before = server.counters
MallocInterposerSwift.initialize()
MallocInterposerSwift.hook()
turns(measured)
MallocInterposerSwift.unhook()
let stats = MallocInterposerSwift.getStatistics()
let after = server.counters
let perAdvertisement = Double(stats.mallocCount) / Double(measured)

// Active scanning: the same, each advertisement followed by its scan response.
server.setScannerState(ScannerState.running, mode: ScannerMode.active)
turns(5_000, active: true)
let mergedBefore = server.scanResponses.merged
MallocInterposerSwift.initialize()
MallocInterposerSwift.hook()
turns(measured, active: true)
MallocInterposerSwift.unhook()
let activeStats = MallocInterposerSwift.getStatistics()
let activePerAdvertisement = Double(activeStats.mallocCount) / Double(measured)
let merged = server.scanResponses.merged - mergedBefore

// A connection: the device's end of a socketpair, its PDUs written from fixed buffers (so the
// count is the gateway's and the server's alone).
struct BenchLink: DeviceLink {
    let fd: Int32
    func connect(to device: LinkAddress) throws(LinkError) -> LinkChannel { throw .unreachable("no PSM links in the bench") }
    func connectAttributes(to device: LinkAddress) throws(LinkError) -> LinkChannel {
        LinkChannel(accepted: fd, peer: device, l2cap: false)
    }
    var description: String { "bench socketpair" }
}
var pair: [Int32] = [-1, -1]
precondition(socketpair(AF_UNIX, Int32(SOCK_SEQPACKET.rawValue), 0, &pair) == 0)
let device = pair[1]
_ = BatonLibc.fcntl(device, F_SETFL, BatonLibc.fcntl(device, F_GETFL) | O_NONBLOCK)
var connections = GATTConnections(limit: 3, link: AnyDeviceLink(BenchLink(fd: pair[0])))
let thermometer: UInt64 = 0xC0FF_EE00_0001
let benchClient = GATTClient(slot: 0, serial: 1)  // the server's first client
let deviceBuffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 1024, alignment: 8)
let mtuResponse: [UInt8] = [0x03, 0xF7, 0x00]
let notification: [UInt8] = [0x1B, 0x09, 0x00, 0x34, 0x08]
var fds: [pollfd] = []
fds.reserveCapacity(4)
@MainActor func connectionTurn() {
    fds.removeAll(keepingCapacity: true)
    connections.pollDescriptors(into: &fds)
    _ = fds.withUnsafeMutableBufferPointer { Glibc.poll($0.baseAddress, nfds_t($0.count), 0) }
    connections.serve(fds[...], now: .now, to: &server)
    server.flush(now: .now)
    drainClient()
}
let noData = UnsafeRawBufferPointer(start: nil, count: 0)
connections.ask(.connect(addressType: 1), client: benchClient, address: thermometer, data: noData, now: .now, to: &server)
// The device answers the MTU request (its first PDU) with 247.
for _ in 0..<100 where connections.counters.connected == 0 {
    if recv(device, deviceBuffer.baseAddress, deviceBuffer.count, 0) > 0 {
        _ = mtuResponse.withUnsafeBytes { send(device, $0.baseAddress, $0.count, 0) }
    }
    connectionTurn()
}
connections.ask(.notify(handle: 9, enable: true), client: benchClient, address: thermometer, data: noData, now: .now, to: &server)
@MainActor func notifications(_ count: Int) {
    var i = 0
    while i < count {
        for _ in 0..<8 { _ = notification.withUnsafeBytes { send(device, $0.baseAddress, $0.count, 0) } }
        i += 8
        connectionTurn()
    }
}
notifications(5_000)
let notifiedBefore = connections.counters.notifications
MallocInterposerSwift.initialize()
MallocInterposerSwift.hook()
notifications(measured)
MallocInterposerSwift.unhook()
let gattStats = MallocInterposerSwift.getStatistics()
let notified = connections.counters.notifications - notifiedBefore
let perNotification = Double(gattStats.mallocCount) / Double(max(notified, 1))
print("""
{"advertisements": \(measured), "mallocs": \(stats.mallocCount), "allocations_per_advertisement": \(perAdvertisement), \
"sent": \(after.advertisementsSent - before.advertisementsSent), "dropped": \(after.advertisementsDropped - before.advertisementsDropped), \
"batches": \(after.batchesSent - before.batchesSent), "bytes_drained": \(drained), "calibration_mallocs": \(calibration), \
"active_mallocs": \(activeStats.mallocCount), "active_allocations_per_advertisement": \(activePerAdvertisement), \
"active_scan_responses_merged": \(merged), "connected": \(connections.counters.connected), \
"notifications": \(notified), "notification_mallocs": \(gattStats.mallocCount), \
"allocations_per_notification": \(perNotification), "connection_slot_bytes": \(GATTConnections.bytesPerSlot), "budget": \(budget)}
""")
exit(perAdvertisement > budget || activePerAdvertisement > budget || merged != measured / 2
     || connections.counters.connected != 1 || notified < measured || perNotification > budget ? 1 : 0)
