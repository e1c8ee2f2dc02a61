// `baton sim`: simulated devices and rooms (docs/simulator.md): a building following a
// scenario, one room's controller, or a capture file.
import BatonLibc
import ArgumentParser
import BatonGateway
import BatonHCI
import BatonSim
import BatonWire
import Foundation
import Glibc

struct Sim: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Simulated devices and rooms.",
        discussion: """
            baton sim --scenario FILE --sockets DIR runs a building of simulated rooms (the default \
            subcommand, "building"); see docs/simulator.md "Scenarios".
            """,
        subcommands: [BuildingCommand.self, Capture.self, Room.self, Sensor.self],
        defaultSubcommand: BuildingCommand.self)

    struct Capture: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Write a btsnoop capture of simulated devices with known contents.",
            discussion: """
                A third of the devices send activity beacons (their sequence bumps as they save), a third \
                Apple Continuity frames (Nearby Info + Handoff), a third named ordinary adverts. The same \
                seed always writes the same file.
                """)

        @Argument(help: "Where to write the capture.")
        var output: String

        @Option(help: "Number of simulated devices.")
        var devices = 12

        @Option(help: "Number of advertising reports.")
        var reports = 200

        @Option(help: "Random seed.")
        var seed: UInt64 = 1

        @Option(help: "File format: android (btsnoop 1002, H4) or btmon (btsnoop 2001, Linux monitor).")
        var format: String = "android"

        @Flag(help: "Extended devices send long advertisements (230–699 bytes) as interleaved chains of reports (docs/radio.md \"Advertisements in fragments\").")
        var long = false

        @Flag(help: "End with one invalidating beacon per Baton device.")
        var invalidate = false

        @Option(help: "The company id beacons are sent under (default 0xFFFF).",
                transform: { s throws(ValidationError) in try parseCompanyID(s) })
        var companyID: UInt16 = ActivityBeacon.defaultCompanyID

        func validate() throws {
            guard devices >= 1, devices <= 100_000 else { throw ValidationError("--devices must be 1…100000") }
            guard reports >= 0, reports <= 50_000_000 else { throw ValidationError("--reports must be 0…50000000") }
            guard format == "android" || format == "btmon" else { throw ValidationError("--format is android or btmon") }
        }

        func run() throws {
            var generator = CaptureGenerator(devices: devices, seed: seed, beaconCompanyID: companyID)
            generator.longAdvertisements = long
            let (file, written) = generator.capture(reports: reports, datalink: format == "btmon" ? .btmon : .androidH4,
                                                    invalidateAtEnd: invalidate)
            guard FileManager.default.createFile(atPath: output, contents: Data(file)) else {
                throw ValidationError("cannot write \(output)")
            }
            print("wrote \(written.count) reports from \(devices) devices to \(output) (\(file.count) bytes)")
        }
    }
}

extension Sim {
    /// `baton sim room`: one room's virtual controller on a Unix socket, for `baton gateway
    /// --radio sim:SOCKET` (docs/simulator.md "A room's controller").
    struct Room: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Serve one room's virtual controller (H4 over a Unix socket) with simulated devices.",
            discussion: """
                A gateway started with --radio sim:SOCKET connects, initialises the controller and \
                scans; the devices' advertisements then arrive at --rate per second. A gateway that \
                disconnects can connect again. Stops on Ctrl-C, or after --reports reports.
                """)

        @Option(help: "The Unix socket to listen on.")
        var socket: String

        @Option(help: "Number of simulated devices.")
        var devices = 12

        @Option(help: "Random seed.")
        var seed: UInt64 = 1

        @Option(help: "Advertising reports per second.")
        var rate = 50

        @Flag(help: "Play a Bluetooth 5 controller: report LE Extended Advertising and deliver extended reports, long advertisements as interleaved chains.")
        var extended = false

        @Option(help: "Stop after this many reports delivered (0: run until stopped).")
        var reports = 0

        func validate() throws {
            guard devices >= 1, rate >= 1, rate <= 100_000, reports >= 0 else {
                throw ValidationError("--devices and --rate must be at least 1 (rate at most 100000), --reports at least 0")
            }
        }

        func run() throws {
            let listener = try listen(socket)
            defer { close(listener); unlink(socket) }
            var generator = CaptureGenerator(devices: devices, seed: seed)
            generator.longAdvertisements = extended
            var controller: VirtualController?
            let interval = Duration.seconds(1) / rate
            var due = Instant.now
            var delivered = 0
            Stderr.say("sim room", "listening on \(socket)")
            while reports == 0 || delivered < reports {
                var fds = [pollfd(fd: controller?.fd ?? listener, events: Int16(POLLIN), revents: 0)]
                if controller?.wantsWrite == true { fds[0].events |= Int16(POLLOUT) }
                _ = Glibc.poll(&fds, 1, (due - .now).pollMilliseconds(atMost: 1000))
                if controller == nil {
                    if fds[0].revents != 0 {
                        let fd = accept(listener, nil, nil)
                        if fd >= 0 { controller = VirtualController(fd: fd, extended: extended) }
                    }
                    due = .now
                    continue
                }
                controller!.poll()
                if controller!.closed {
                    controller = nil
                    Stderr.say("sim room", "the gateway disconnected; waiting for it")
                    continue
                }
                while Instant.now >= due, reports == 0 || delivered < reports {
                    let before = controller!.reportsDelivered
                    controller!.deliver(generator.next())
                    delivered += controller!.reportsDelivered - before
                    due += interval
                }
            }
        }

        func listen(_ path: String) throws -> Int32 {
            unlink(path)
            let fd = Glibc.socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
            guard var unix = Syscall.unixAddress(path) else {
                throw ValidationError("--socket: \(path) is longer than a Unix socket path may be")
            }
            let r = withUnsafePointer(to: &unix.address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, unix.length) }
            }
            guard r == 0, Glibc.listen(fd, 1) == 0 else {
                throw ValidationError("--socket: cannot listen on \(path): \(String(cString: strerror(Glibc.errno)))")
            }
            return fd
        }
    }
}

extension Sim {
    /// `baton sim --scenario FILE --sockets DIR`: a building of simulated rooms, each a virtual
    /// controller on `DIR/<room id>.sock`, with devices following the scenario
    /// (docs/simulator.md "Scenarios"). Prints JSON lines on stdout, one per happening.
    struct BuildingCommand: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "building",
            abstract: "Run a building of simulated rooms and devices following a scenario.",
            discussion: """
                Listens on DIR/<room id>.sock for every room of the scenario; a gateway connects with \
                --radio sim:DIR/<room id>.sock. Beside it, DIR/<room id>.link is the room's device link \
                (docs/protocol.md 5.5): the devices answer fetches and echo streams there. The scenario \
                clock starts when every room's gateway scans (or at once with --no-wait) and runs for \
                the scenario's duration. stdout carries JSON lines: ready, start, one per scenario \
                step, continued, end. Ctrl-C or SIGTERM ends early, the same way. A bad scenario file \
                exits 2 with FILE:LINE: KEY: the problem.
                """)

        @Option(help: "The scenario file (YAML, docs/simulator.md \"Scenarios\").")
        var scenario: String

        @Option(help: "The directory for the rooms' sockets (created if needed).")
        var sockets: String

        @Flag(help: "Start the scenario clock at once instead of waiting for every room's gateway to scan.")
        var noWait = false

        @Option(help: "Random seed, instead of the scenario's.")
        var seed: UInt64?

        func run() throws {
            var plan: Scenario
            do throws(ScenarioError) {
                plan = try Scenario.load(file: scenario)
            } catch {
                // Each line `FILE:LINE: KEY: …`, as compilers print, so editors jump to it.
                Stderr.line("\(error)")
                throw ExitCode(2)
            }
            if let seed { plan.seed = seed }
            do {
                try FileManager.default.createDirectory(atPath: sockets, withIntermediateDirectories: true)
            } catch {
                Stderr.say("sim", "--sockets: cannot create \(sockets): \(error.localizedDescription)")
                throw ExitCode(1)
            }
            // Before listening: a stop that arrives while we set up still ends us cleanly.
            let stop = StopSignals()
            let building: Building
            do throws(BuildingError) {
                building = try Building(scenario: plan, directory: sockets)
            } catch {
                Stderr.say("sim", "\(error)")
                throw ExitCode(1)
            }
            emit(building.readyLine())
            building.run(waitForScanning: !noWait, stop: stop.fd) { output in
                switch output {
                case .connected(let r):
                    Stderr.say("sim", "\(plan.rooms[r].id): a gateway connected")
                case .disconnected(let r):
                    Stderr.say("sim", "\(plan.rooms[r].id): the gateway disconnected; waiting for it")
                default:
                    if let line = building.line(output) { emit(line) }
                }
            }
        }

        /// One line, written at once (scripts read them live). Not FileHandle.write, which traps
        /// when the reader has gone; a reader that has gone simply gets nothing more.
        func emit(_ line: String) {
            var bytes = Array((line + "\n").utf8)
            var offset = 0
            while offset < bytes.count {
                let n = bytes[offset...].withUnsafeMutableBytes { Glibc.write(1, $0.baseAddress, $0.count) }
                if n < 0, Glibc.errno == EINTR { continue }
                guard n > 0 else { return }
                offset += n
            }
        }
    }
}
