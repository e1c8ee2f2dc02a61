// What several test targets read: the repository's own files (docs, Tests/Fixtures), and the
// mean of the RSSI levels a room heard.
import Foundation

/// The repository's root: Tests/BatonTestSupport/Fixtures.swift, three levels up.
public let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

/// The mean of RSSI levels in dBm; NaN for none.
public func mean(_ values: [Int8]) -> Double {
    values.isEmpty ? .nan : Double(values.reduce(0) { $0 + Int($1) }) / Double(values.count)
}
