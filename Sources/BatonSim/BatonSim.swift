public enum BatonSim {}
