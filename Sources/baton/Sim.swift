// `baton sim`: simulated devices. For now it writes captures of them (docs/simulator.md).
import ArgumentParser
import BatonSim
import BatonWire
import Foundation

struct Sim: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Simulated devices and rooms.",
        subcommands: [Capture.self])

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
            let (file, written) = generator.capture(reports: reports, datalink: format == "btmon" ? .btmon : .androidH4,
                                                    invalidateAtEnd: invalidate)
            guard FileManager.default.createFile(atPath: output, contents: Data(file)) else {
                throw ValidationError("cannot write \(output)")
            }
            print("wrote \(written.count) reports from \(devices) devices to \(output) (\(file.count) bytes)")
        }
    }
}
