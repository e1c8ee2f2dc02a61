// The radio watchdog (docs/mqtt.md §1 `radio.restarts`, docs/config.md `radio.silence`): a
// controller that stops delivering reports while scanning is re-initialised, counted and
// reported. The controller here is a scripted H4 peer on the simulator's socket (`sim:`), so
// the gateway's own H4 path runs byte for byte.
import BatonLibc
import BatonHCI
import BatonSim
import BatonTestSupport
import Foundation
import CBlueZ  // its shim includes <sys/socket.h>: the socket types have one owner
import Glibc
import Testing

/// Listens on a Unix socket and hands the connection to BatonSim's VirtualController (what
/// `baton sim room` serves), which answers the init sequence and honours scan enable.
final class ScriptedController {
    let listener: Int32
    var controller: VirtualController?

    init(path: String) throws {
        listener = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var unix = try #require(Syscall.unixAddress(path))
        let r = withUnsafePointer(to: &unix.address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, unix.length) }
        }
        try #require(r == 0 && listen(listener, 1) == 0)
    }

    deinit { close(listener) }

    var commands: [UInt16] { controller?.opcodes ?? [] }

    func accept(timeoutMs: Int32) -> Bool {
        var p = pollfd(fd: listener, events: Int16(POLLIN), revents: 0)
        guard poll(&p, 1, timeoutMs) > 0 else { return false }
        // Close-on-exec: a broker or gateway spawned by a parallel test must not hold it open.
        let fd = Glibc.accept(listener, nil, nil)
        guard fd >= 0 else { return false }
        _ = Glibc.fcntl(fd, F_SETFD, FD_CLOEXEC)
        controller = VirtualController(fd: fd)
        return true
    }

    /// Answers commands for up to `timeoutMs`, until a new one with `opcode` has been answered.
    @discardableResult
    func serve(until opcode: UInt16, timeoutMs: Int) -> Bool {
        guard let controller else { return false }
        let seen = controller.opcodes.count
        let deadline = Date().addingTimeInterval(Double(timeoutMs) / 1000)
        while Date() < deadline, !controller.closed {
            var p = pollfd(fd: controller.fd, events: Int16(POLLIN), revents: 0)
            _ = poll(&p, 1, 50)
            controller.poll()
            if controller.opcodes[seen...].contains(opcode) { return true }
        }
        return false
    }

    func send(_ bytes: [UInt8]) { controller?.send(h4: bytes) }

    func hangUp() {
        controller?.hangUp()
        controller = nil
    }
}

struct WatchdogTests {
    @Test func silentControllerIsReinitialisedAndCounted() throws {
        let dir = try scratchDirectory("watchdog")
        let socketPath = dir.appendingPathComponent("ctl.sock").path
        let controller = try ScriptedController(path: socketPath)
        let broker = try MosquittoBroker()
        let yaml = gatewayYAML(port: broker.port, radio: "sim:\(socketPath)")
            .replacingOccurrences(of: "silence: 30s", with: "silence: 2s")
        let gateway = try GatewayProcess(yaml: yaml, in: dir)
        defer { gateway.kill() }

        try #require(controller.accept(timeoutMs: 10_000), "the gateway never connected: \(gateway.log)")
        // HCI_Reset … LE_Set_Scan_Enable (0x200C): the init sequence of a controller Baton owns.
        try #require(controller.serve(until: 0x200C, timeoutMs: 10_000), "init never finished: \(controller.commands)")
        #expect(controller.commands.first == 0x0C03)
        // Reports flow for a while: a beacon device is heard.
        var g = CaptureGenerator(devices: 3, seed: 5)
        for _ in 0..<20 {
            let r = g.next()
            controller.send([0x04] + AdvertisingEvents.event([r][...]))
        }
        let status = "baton/activities/+"
        #expect(try eventually(within: 10) { try broker.retained(status).count == 1 ? true : nil } == true, "\(gateway.log)")
        // Then the controller goes quiet while scanning: after 2 s the gateway starts over
        // with a Reset, and says so.
        let before = controller.commands.count
        #expect(controller.serve(until: 0x0C03, timeoutMs: 10_000), "no re-initialisation: \(gateway.log)")
        #expect(controller.commands.dropFirst(before).first == 0x0C03, "the first command after the silence is HCI_Reset")
        let stats = "baton/gateways/hall/stats"
        let restarts = try eventually(within: 10) { () -> Int? in
            let radio = json(try broker.retained(stats)[stats] ?? [])?["radio"] as? [String: Any]
            return (radio?["restarts"] as? Int).flatMap { $0 >= 1 ? $0 : nil }
        }
        #expect(restarts != nil, "\(gateway.log)")
        #expect(gateway.log.contains("re-initialising the controller"))
        // The activity heard before is still held: re-initialising the radio loses no state.
        #expect(try broker.retained(status).count == 1)
    }

    /// A controller that goes away (a simulator restarted, a USB controller unplugged) is
    /// opened again after 5 s, and the gateway does not spin on the dead descriptor meanwhile.
    @Test func closedControllerIsOpenedAgainWithoutSpinning() throws {
        let dir = try scratchDirectory("reopen")
        let socketPath = dir.appendingPathComponent("ctl.sock").path
        let controller = try ScriptedController(path: socketPath)
        let broker = try MosquittoBroker()
        let gateway = try GatewayProcess(yaml: gatewayYAML(port: broker.port, radio: "sim:\(socketPath)"), in: dir)
        defer { gateway.kill() }
        try #require(controller.accept(timeoutMs: 10_000), "the gateway never connected: \(gateway.log)")
        try #require(controller.serve(until: 0x200C, timeoutMs: 10_000))
        let cpuBefore = try cpuTicks(gateway.process.processIdentifier)
        controller.hangUp()
        #expect(controller.accept(timeoutMs: 15_000), "not opened again: \(gateway.log)")
        let cpuAfter = try cpuTicks(gateway.process.processIdentifier)
        // About 5 s passed; a loop polling the dead descriptor would burn all of them.
        #expect(cpuAfter - cpuBefore < 150, "\(cpuAfter - cpuBefore) ticks of CPU while waiting to reopen")
        #expect(controller.serve(until: 0x200C, timeoutMs: 10_000), "init after reopening: \(gateway.log)")
        #expect(gateway.log.contains("opened again"))
    }
}

/// utime + stime of a process, in clock ticks (proc(5), /proc/PID/stat fields 14 and 15).
func cpuTicks(_ pid: Int32) throws -> Int {
    let stat = try String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8)
    // The command name may hold spaces; the fields after its closing parenthesis do not.
    let after = stat[stat.index(after: try #require(stat.lastIndex(of: ")")))...]
    let fields = after.split(separator: " ")
    return (Int(fields[11]) ?? 0) + (Int(fields[12]) ?? 0)
}

/// docs/simulator.md "A room's controller": `baton sim room` is a controller the gateway's H4
/// path initialises and scans with; the room's Baton devices appear on the broker.
struct SimulatedRoomTests {
    @Test func aGatewayOnASimulatedRoomPublishesItsDevices() throws {
        let dir = try scratchDirectory("simroom")
        let socketPath = dir.appendingPathComponent("room.sock").path
        let broker = try MosquittoBroker()
        let room = try ChildProcess(batonBinary.path, ["sim", "room", "--socket", socketPath, "--devices", "9",
                                                       "--seed", "3", "--rate", "400"])
        defer { room.signal(SIGKILL); room.wait(timeout: .seconds(5)) }
        try #require(eventually(within: 10) { FileManager.default.fileExists(atPath: socketPath) ? true : nil } == true)
        let gateway = try GatewayProcess(yaml: gatewayYAML(port: broker.port, radio: "sim:\(socketPath)"), in: dir)
        defer { gateway.kill() }
        // Devices 0, 3 and 6 of nine send beacons (a third of them, docs/simulator.md).
        let activities = try broker.retained("baton/activities/+", within: 15) { $0.count == 3 }
        #expect(activities != nil, "\(gateway.log)")
        // The stats are republished every second: the radio reads scanning once init is done.
        let scanning = try eventually(within: 10) { () -> Bool? in
            let stats = json(try broker.retained("baton/gateways/hall/stats")["baton/gateways/hall/stats"] ?? [])
            return (stats?["radio"] as? [String: Any])?["state"] as? String == "scanning" ? true : nil
        }
        #expect(scanning == true, "\(gateway.log)")
    }
}
