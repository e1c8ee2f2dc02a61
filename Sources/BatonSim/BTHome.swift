// A BTHome v2 sensor's advertisement (bthome.io/format), for the simulator's `bthome:` sensors
// (docs/simulator.md "BTHome sensors"): what a thermometer with BTHome firmware sends, so that
// Home Assistant's BTHome integration, hearing it through a gateway's ESPHome server
// (docs/esphome.md), shows a sensor with the simulated values.
//
// Layout: the Flags AD (`02 01 06`: LE General Discoverable, BR/EDR not supported), then the
// Service Data AD (type 0x16) under the 16-bit UUID 0xFCD2 (little-endian `D2 FC`): the device
// information byte 0x40 (bits 5–7 = 2: BTHome v2; bit 0 = 0: not encrypted; bit 2 = 0: regular
// updates), then the measurements in object-id order, each its id and its value little-endian:
//   0x02 temperature, sint16, × 0.01 °C      (`02 CA 09` = 25.06 °C)
//   0x03 humidity,    uint16, × 0.01 %       (`03 BF 13` = 50.55 %)
// and, when the sensor has a name, the Complete Local Name AD (type 0x09).

public enum BTHome {
    /// BTHome's 16-bit service UUID (bthome.io/format).
    public static let serviceUUID: UInt16 = 0xFCD2
    /// The device information byte: BTHome v2, not encrypted, regular updates.
    public static let deviceInfoV2: UInt8 = 0x40
    public static let temperatureID: UInt8 = 0x02
    public static let humidityID: UInt8 = 0x03
    /// °C a sint16 of hundredths holds.
    public static let temperatureRange = -327.68...327.67
    public static let humidityRange = 0.0...100.0
    /// Bytes a name may take: a legacy advertisement is 31 bytes, and the flags (3), the
    /// service data with both measurements (11) and the name's own header (2) take 16.
    public static let maxNameBytes = 15

    /// The advertising data: flags, the service data, the name. `temperature` in °C and
    /// `humidity` in %, rounded to hundredths; the caller keeps them in range.
    public static func advertisement(temperature: Double?, humidity: Double?, name: String?) -> [UInt8] {
        var serviceData: [UInt8] = [0x16, UInt8(serviceUUID & 0xFF), UInt8(serviceUUID >> 8), deviceInfoV2]
        if let t = temperature {
            precondition(temperatureRange.contains(t), "BTHome temperature out of range")
            let v = UInt16(bitPattern: Int16((t * 100).rounded()))
            serviceData += [temperatureID, UInt8(v & 0xFF), UInt8(v >> 8)]
        }
        if let h = humidity {
            precondition(humidityRange.contains(h), "BTHome humidity out of range")
            let v = UInt16((h * 100).rounded())
            serviceData += [humidityID, UInt8(v & 0xFF), UInt8(v >> 8)]
        }
        var out: [UInt8] = [0x02, 0x01, 0x06, UInt8(serviceData.count)] + serviceData
        if let name {
            precondition(name.utf8.count <= maxNameBytes, "BTHome name too long")
            out += [UInt8(name.utf8.count + 1), 0x09] + Array(name.utf8)
        }
        return out
    }
}
