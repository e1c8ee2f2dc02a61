// swift-tools-version: 6.1
// Baton: carries a person's current activity across the rooms of a building.
// Module map and the rule "arrows point down": docs/architecture.md §1.
import PackageDescription
import Foundation

// Decoders read borrowed bytes through `ByteReader`, a checked cursor over an
// `UnsafeRawBufferPointer` that lives only inside `withUnsafeBytes`. We chose it over a
// `~Escapable` reader storing a `RawSpan` because that needs the experimental "Lifetimes"
// feature on 6.3; the unsafe pointer is never read without the `need <= remaining` check,
// and the fuzz targets run under AddressSanitizer to prove it.

let wireSettings: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
]

var targets: [Target] = [
    // C libraries, each wrapped once (architecture.md §5.6).
    // libc itself: Embedded Swift has no Glibc module, so the firmware's modules reach libc
    // through this map in both builds, and BatonLibc wraps what a map cannot carry (errno,
    // fcntl) and the monotonic clock (docs/firmware.md).
    .systemLibrary(name: "CLibc"),
    .systemLibrary(name: "CMosquitto", pkgConfig: "libmosquitto",
                   providers: [.apt(["libmosquitto-dev"])]),
    .systemLibrary(name: "CBlueZ", pkgConfig: "bluez",
                   providers: [.apt(["libbluetooth-dev"])]),
    .systemLibrary(name: "CCrypto", pkgConfig: "libcrypto",
                   providers: [.apt(["libssl-dev"])]),
    // Debian's libyaml, for its event parser: BatonYAML composes a file's events into nodes
    // itself, iteratively, with the nesting bounded. Yams is not used: it cannot build as
    // Embedded Swift, and it composed recursively (issue 16).
    .systemLibrary(name: "CYAML", pkgConfig: "yaml-0.1",
                   providers: [.apt(["libyaml-dev"])]),

    .target(name: "BatonLibc", dependencies: ["CLibc"], swiftSettings: wireSettings),
    .target(name: "BatonWire", swiftSettings: wireSettings),
    .target(name: "BatonHCI", dependencies: ["BatonLibc", "CLibc", "BatonWire", "CBlueZ"], swiftSettings: wireSettings),
    // Scenarios are YAML like the gateway's config (docs/simulator.md "Scenarios").
    // BatonKeys: simulated devices of a keyed group seal their payloads as real ones do.
    // The two YAML files Baton reads (the config, scenarios) share their composer on libyaml,
    // their error shape and their schema checks. Embedded Swift: CYAML is all it imports.
    .target(name: "BatonYAML", dependencies: ["CYAML"], swiftSettings: wireSettings),
    // The device's side of device links (docs/protocol.md §5): `baton device` on real L2CAP
    // channels and the simulator's devices on their rooms' sockets run the same server. Toolbox
    // only: the firmware is never the device, so this is full Swift (it holds its model as an
    // `any LinkDeviceModel`) and scripts/firmware does not build it.
    .target(name: "BatonDevice", dependencies: ["BatonLibc", "CLibc", "BatonWire", "BatonKeys"],
            swiftSettings: wireSettings),
    .target(name: "BatonSim", dependencies: ["BatonLibc", "CLibc", "BatonWire", "BatonHCI", "BatonKeys", "BatonYAML", "BatonDevice"],
            swiftSettings: wireSettings),
    .target(name: "BatonCore", dependencies: ["BatonLibc", "CLibc", "BatonWire"], swiftSettings: wireSettings),
    .target(name: "BatonKeys", dependencies: ["BatonLibc", "CLibc", "BatonWire", "CCrypto"], swiftSettings: wireSettings),
    // The ESPHome native API server: each gateway is also a Bluetooth proxy for Home Assistant
    // (docs/esphome.md). BatonHCI only for its syscall wrapper, as BatonRelay.
    .target(name: "BatonProxy", dependencies: ["BatonLibc", "CLibc", "BatonWire", "CCrypto"], swiftSettings: wireSettings),
    .target(name: "BatonMQTT", dependencies: ["BatonLibc", "CLibc", "CMosquitto"], swiftSettings: wireSettings),
    // Payload fetches and continuation streams (docs/relay.md). Its descriptors go through
    // BatonLibc's one syscall wrapper (Syscall, Errno), as every module's do.
    .target(name: "BatonRelay", dependencies: ["BatonLibc", "CLibc", "BatonWire", "BatonMQTT", "CBlueZ"],
            swiftSettings: wireSettings),
    // The config file is YAML (docs/config.md): what a Home Assistant user already writes, and
    // BatonYAML gives every node its line, so a typo is reported with file, line and key.
    .target(name: "BatonGateway",
            dependencies: ["BatonLibc", "CLibc", "BatonWire", "BatonHCI", "BatonCore", "BatonMQTT", "BatonRelay", "BatonYAML", "BatonKeys",
                           "BatonProxy"],
            swiftSettings: wireSettings),
    .executableTarget(
        name: "baton",
        dependencies: [
            "BatonLibc", "BatonWire", "BatonHCI", "BatonDevice", "BatonSim", "BatonCore", "BatonMQTT", "BatonRelay", "BatonGateway", "BatonKeys",
            "BatonProxy",
            .product(name: "ArgumentParser", package: "swift-argument-parser"),
        ]),
    // The firmware's main (docs/firmware.md): scripts/firmware builds it and the modules above
    // as Embedded Swift; here it builds as full Swift, so the tests run its argument parsing.
    .executableTarget(name: "BatonFirmware", dependencies: ["BatonGateway", "BatonLibc", "CLibc"], swiftSettings: wireSettings),

    // Starts a real mosquitto on 127.0.0.1 and a free port for the tests that need a broker,
    // and turns the parts under test as the gateway's loop does (TestLoop).
    .target(name: "BatonTestSupport", dependencies: ["BatonLibc", "BatonRelay", "BatonSim", "CBlueZ"], path: "Tests/BatonTestSupport"),

    .testTarget(name: "BatonYAMLTests", dependencies: ["BatonYAML"]),
    .testTarget(name: "BatonWireTests", dependencies: ["BatonLibc", "BatonWire", "BatonTestSupport"], exclude: ["Interop"]),
    .testTarget(name: "BatonHCITests", dependencies: ["BatonLibc", "BatonHCI", "BatonWire", "BatonSim", "BatonTestSupport"]),
    // The toolbox's commands, mostly as the built `baton` run as a child process.
    .testTarget(name: "BatonCLITests", dependencies: ["BatonLibc", "BatonHCI", "BatonWire", "BatonSim", "BatonTestSupport", "baton"]),
    // The simulator in process: scenarios, the RSSI model, simulated payloads, the capture generator.
    .testTarget(name: "BatonSimTests", dependencies: ["BatonSim", "BatonWire", "BatonTestSupport"]),
    // The device's side of links in process: adopted channels, as `baton device` hands them over.
    .testTarget(name: "BatonDeviceTests", dependencies: ["BatonLibc", "BatonDevice", "BatonHCI", "BatonWire", "BatonTestSupport"]),
    .testTarget(name: "BatonCoreTests", dependencies: ["BatonLibc", "BatonCore", "BatonWire", "BatonTestSupport"]),
    .testTarget(name: "BatonKeysTests", dependencies: ["BatonLibc", "BatonKeys", "BatonWire", "BatonTestSupport"], exclude: ["Interop"]),
    .testTarget(name: "BatonRelayTests", dependencies: ["BatonLibc", "BatonRelay", "BatonWire", "BatonHCI", "BatonMQTT", "BatonSim",
                                                        "BatonTestSupport"]),
    .testTarget(name: "BatonProxyTests", dependencies: ["BatonLibc", "BatonProxy", "BatonRelay", "BatonWire", "BatonHCI", "BatonSim", "BatonTestSupport"],
                exclude: ["Interop"]),
    .testTarget(name: "BatonMQTTTests", dependencies: ["BatonLibc", "BatonMQTT", "BatonTestSupport"]),
    .testTarget(name: "BatonGatewayTests",
                dependencies: ["BatonLibc", "BatonGateway", "BatonCore", "BatonMQTT", "BatonRelay", "BatonHCI", "BatonWire", "BatonSim", "BatonKeys",
                               "BatonProxy", "BatonTestSupport", "baton"]),
]

// Fuzz targets: one per decoder of untrusted bytes. Built plain they replay corpus files
// given as arguments (tests use that); scripts/fuzz builds them with -sanitize=fuzzer and
// -DBATON_LIBFUZZER, and their main hands control to libFuzzer's driver.
let fuzzTargets = ["FuzzAD", "FuzzBeacon", "FuzzContinuity", "FuzzPayload", "FuzzH4", "FuzzHCIEvent", "FuzzCapture", "FuzzSighting",
                   "FuzzLinkMessage", "FuzzFetchRequest", "FuzzSealed", "FuzzReassembly", "FuzzSightingBatch", "FuzzATT"]
targets.append(.target(name: "FuzzSupport", path: "Tests/Fuzz/FuzzSupport"))
for name in fuzzTargets {
    targets.append(.executableTarget(
        name: name, dependencies: ["BatonWire", "BatonHCI", "BatonKeys", "FuzzSupport"], path: "Tests/Fuzz/\(name)"))
}
// The YAML composer under the config and scenario readers (docs/config.md "Errors").
targets.append(.executableTarget(
    name: "FuzzYAML", dependencies: ["BatonYAML", "FuzzSupport"], path: "Tests/Fuzz/FuzzYAML"))
// The ESPHome API server's decoders: frames, Home Assistant's messages, the Noise handshake
// (docs/esphome.md).
for name in ["FuzzESPHomeFrame", "FuzzESPHomeMessage", "FuzzNoiseHandshake"] {
    targets.append(.executableTarget(name: name, dependencies: ["BatonProxy", "BatonWire", "FuzzSupport"], path: "Tests/Fuzz/\(name)"))
}
// What re-advertising reads off the broker is parsed in the gateway (docs/relay.md §9).
targets.append(.executableTarget(
    name: "FuzzRelayedActivity", dependencies: ["BatonGateway", "BatonMQTT", "BatonWire", "BatonKeys", "FuzzSupport"],
    path: "Tests/Fuzz/FuzzRelayedActivity"))

var dependencies: [Package.Dependency] = [
    .package(url: "https://github.com/apple/swift-argument-parser", from: "1.5.0"),
]

// The benchmark and its malloc counter build only for scripts/bench (BATON_BENCH=1), so the
// test suite does not pay for them. The counter is ordo-one/malloc-interposer, the library
// behind ordo-one/benchmark's malloc metrics on Swift 6.3: a dynamic library that replaces
// malloc & co. for the whole process and counts calls while enabled. BatonBench is a plain
// executable rather than a package-benchmark suite because scripts/bench needs what a suite
// does not print: reports/s over one whole capture, allocations per report, and the capture
// file itself for the C walk and the Python peers (docs/performance.md).
if ProcessInfo.processInfo.environment["BATON_BENCH"] != nil {
    dependencies.append(.package(url: "https://github.com/ordo-one/malloc-interposer", from: "1.6.1"))
    targets.append(.executableTarget(
        name: "BatonBench",
        dependencies: ["BatonWire", "BatonHCI", "BatonSim",
                       .product(name: "ArgumentParser", package: "swift-argument-parser"),
                       .product(name: "MallocInterposerSwift", package: "malloc-interposer")],
        path: "Tests/Benchmarks/BatonBench"))
    // The gateway figures (docs/performance.md "The gateway"): end-to-end latency and peak
    // memory of the release `baton gateway` as a child process, and allocations per unchanged
    // advertisement through the whole loop in process. BatonTestSupport gives it the same
    // throwaway mosquitto the tests use.
    targets.append(.executableTarget(
        name: "GatewayBench",
        dependencies: ["BatonLibc", "BatonGateway", "BatonCore", "BatonMQTT", "BatonHCI", "BatonRelay", "BatonSim", "BatonWire", "BatonKeys",
                       "BatonProxy", "BatonTestSupport", "CMosquitto",
                       .product(name: "ArgumentParser", package: "swift-argument-parser"),
                       .product(name: "MallocInterposerSwift", package: "malloc-interposer")],
        path: "Tests/Benchmarks/GatewayBench"))
    // The ESPHome API server: allocations per advertisement with one Noise client subscribed
    // (docs/performance.md "The ESPHome proxy").
    targets.append(.executableTarget(
        name: "ProxyBench",
        dependencies: ["BatonLibc", "BatonProxy", "BatonRelay", "BatonWire", "CBlueZ",
                       .product(name: "MallocInterposerSwift", package: "malloc-interposer")],
        path: "Tests/Benchmarks/ProxyBench"))
}

let package = Package(
    name: "Baton",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "baton", targets: ["baton"]),
    ],
    dependencies: dependencies,
    targets: targets
)
