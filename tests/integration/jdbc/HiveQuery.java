import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.List;

/**
 * A BI tool's view of the SQL endpoint: Hive's standalone JDBC driver (the jar DBeaver and
 * others load), run by tests/integration/test_sql_endpoint.py with Java's source launcher.
 *
 * <p>Usage: {@code java -cp hive-jdbc-standalone.jar HiveQuery.java URL USER PASSWORD}, one
 * statement per line on stdin. Prints one line per statement: {@code ok} and its rows (cells
 * tab-separated, rows separated by {@code \u001e}), or {@code error} and the server's message
 * in one line. Exits 2 when the connection itself is refused, with the message.
 */
public final class HiveQuery {
  public static void main(String[] args) throws Exception {
    Connection connection;
    try {
      connection = DriverManager.getConnection(args[0], args[1], args[2]);
    } catch (SQLException e) {
      System.out.println("refused\t" + oneLine(e));
      System.exit(2);
      return;
    }
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    try (connection) {
      for (String sql = in.readLine(); sql != null; sql = in.readLine()) {
        if (sql.isBlank()) {
          continue;
        }
        try (Statement statement = connection.createStatement()) {
          List<String> rows = new ArrayList<>();
          if (statement.execute(sql)) {
            ResultSet result = statement.getResultSet();
            int columns = result.getMetaData().getColumnCount();
            while (result.next()) {
              List<String> cells = new ArrayList<>();
              for (int i = 1; i <= columns; i++) {
                cells.add(String.valueOf(result.getString(i)));
              }
              rows.add(String.join("\t", cells));
            }
          }
          System.out.println("ok\t" + String.join("\u001e", rows));
        } catch (SQLException e) {
          System.out.println("error\t" + oneLine(e));
        }
      }
    }
  }

  private static String oneLine(Throwable e) {
    return String.valueOf(e.getMessage()).replace('\n', ' ').replace('\r', ' ');
  }
}
